"""`claimd check-config` through the real console script: it prints what the scheduler fires.

The instants it prints are compared with what the materializer plans for the
same job read back from its stored definition, so a check-config that used a
different reading of cron than the scheduler would fail here.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from actors.config import load_config
from actors.domain import decode_job, encode_job, plan_materialization
from tests.e2e.helpers import child_env, claimd_command, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

START = "2026-03-28T00:00:00+00:00"


def check_config(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*claimd_command(), "check-config", str(path), *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


def printed(stdout: str) -> dict[str, tuple[str, list[list[str]]]]:
    """job -> (its header line, its fire-time lines split into UTC and local)."""
    jobs: dict[str, tuple[str, list[list[str]]]] = {}
    current = ""
    for line in stdout.splitlines():
        if line.startswith("  "):
            jobs[current][1].append(line.split())
        else:
            current = line.split(":", 1)[0]
            jobs[current] = (line, [])
    return jobs


def test_check_config_shows_a_one_value_range_firing_once_a_day(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "claimd.toml",
        jobs="""
[jobs.nine]
cron = "0 9-9 * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.december]
cron = "0 0 1 12-12 *"
run = { shell = ["/bin/true"] }

[jobs.first-or-monday]
cron = "0 0 1 * MON"
run = { shell = ["/bin/true"] }
""",
    )
    result = check_config(path, "--from", START, "--count", "4")
    assert result.returncode == 0, result.stderr
    jobs = printed(result.stdout)

    header, lines = jobs["nine"]
    assert header == (
        "nine: cron '0 9-9 * * *' in Europe/Berlin: minute 0; hour 9; "
        "day-of-month *; month *; day-of-week *"
    )
    # Once a day at 09:00 Berlin time (DST starts on the 29th), not every hour.
    assert lines == [
        ["2026-03-28T08:00:00+00:00", "2026-03-28T09:00:00+01:00"],
        ["2026-03-29T07:00:00+00:00", "2026-03-29T09:00:00+02:00"],
        ["2026-03-30T07:00:00+00:00", "2026-03-30T09:00:00+02:00"],
        ["2026-03-31T07:00:00+00:00", "2026-03-31T09:00:00+02:00"],
    ]

    header, lines = jobs["december"]
    assert header.endswith("day-of-month 1; month 12; day-of-week *")
    assert [line[0] for line in lines] == [
        "2026-12-01T00:00:00+00:00",
        "2027-12-01T00:00:00+00:00",
        "2028-12-01T00:00:00+00:00",
        "2029-12-01T00:00:00+00:00",
    ]

    header, lines = jobs["first-or-monday"]
    assert header.endswith("a day matches if day-of-month OR day-of-week does")
    assert [line[0][:10] for line in lines] == [
        "2026-03-30",
        "2026-04-01",
        "2026-04-06",
        "2026-04-13",
    ]

    # The same instants the materializer plans from the stored definition.
    start = datetime.fromisoformat(START)
    loaded = load_config(str(path))
    for name, (_, lines) in jobs.items():
        job = decode_job(name, encode_job(loaded.jobs[name]))
        plan = plan_materialization(job, start, start, timedelta(days=4 * 366))
        planned = [run.scheduled_at.isoformat() for run in plan.runs[: len(lines)]]
        assert planned == [line[0] for line in lines], name


def test_check_config_refuses_a_quartz_extension_naming_file_job_and_field(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "claimd.toml",
        jobs="""
[jobs.last-day]
cron = "0 0 L * *"
run = { shell = ["/bin/true"] }
""",
    )
    result = check_config(path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {path}: job 'last-day': field 'cron': invalid cron expression "
        "'0 0 L * *': day-of-month 'L': 'L' (last day) is not supported"
    ]

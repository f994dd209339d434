"""`claimd check-config` at DST changes, through the real console script (issue 22).

What it prints is compared with cronsim (an evaluator we did not write, see
tests/unit/dst_reference.py): a wildcard minute or hour at cronsim's instants,
a fixed time as many times per local day; the rule applied is marked.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.e2e.helpers import child_env, claimd_command, write_config
from tests.unit.dst_reference import cronsim_fires

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

JOBS = """
[jobs.quarter]
cron = "*/15 * * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.minute]
cron = "* * * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.half-past-ny]
cron = "30 * * * *"
timezone = "America/New_York"
run = { shell = ["/bin/true"] }

[jobs.sydney-2h]
cron = "0 */2 * * *"
timezone = "Australia/Sydney"
run = { shell = ["/bin/true"] }

[jobs.at-0230]
cron = "30 2 * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.at-0230-both]
cron = "30 2 * * *"
timezone = "Europe/Berlin"
dst = { gap = "skip", fold = "both" }
run = { shell = ["/bin/true"] }
"""


def check_config(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*claimd_command(), "check-config", str(path), *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


def fires(record: dict[str, Any]) -> list[datetime]:
    return [datetime.fromisoformat(f["utc"]) for f in record["fires"]]


def test_check_config_fires_as_cronsim_around_the_fall_change(tmp_path: Path) -> None:
    path = write_config(tmp_path / "claimd.toml", jobs=JOBS)
    # Just before 00:00 in Berlin on its 25-hour day (--from is exclusive).
    start = "2026-10-24T21:59:30+00:00"
    result = check_config(path, "--from", start, "--count", "1500", "--json")
    assert result.returncode == 0, result.stderr
    jobs = {r["job"]: r for r in json.loads(result.stdout)["jobs"]}
    after = datetime.fromisoformat(start)

    # Every minute of Berlin's local day 2026-10-25: 25 hours, 1,500 runs.
    minute = fires(jobs["minute"])
    assert len(minute) == 1500
    assert minute[0] == datetime.fromisoformat("2026-10-24T22:00:00+00:00")
    assert minute[-1] == datetime.fromisoformat("2026-10-25T22:59:00+00:00")

    for name, zone in (
        ("quarter", "Europe/Berlin"),
        ("half-past-ny", "America/New_York"),
        ("sydney-2h", "Australia/Sydney"),
    ):
        ours = fires(jobs[name])
        assert ours == cronsim_fires(jobs[name]["schedule"].split("'")[1], zone, after, ours[-1])

    # A fixed time: once per local day, as cronsim (the first of the two 02:30s).
    berlin = ZoneInfo("Europe/Berlin")
    at_0230 = fires(jobs["at-0230"])
    theirs = cronsim_fires("30 2 * * *", "Europe/Berlin", after, at_0230[-1])
    assert Counter(t.astimezone(berlin).date() for t in at_0230) == Counter(
        t.astimezone(berlin).date() for t in theirs
    )
    # dst.fold = both: twice on the 25th, then once a day; each marked.
    both = jobs["at-0230-both"]["fires"][:3]
    assert [f["local"] for f in both] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-26T02:30:00+01:00",
    ]
    assert [f["dst"] and f["dst"]["rule"] for f in both] == [
        "dst.fold = both: runs at both occurrences",
        "dst.fold = both: runs at both occurrences",
        None,
    ]
    # The default's second 02:30 is listed as skipped, with the rule.
    skipped = jobs["at-0230"]["skipped"][0]  # then one a year: 1,500 days are shown
    assert (skipped["kind"], skipped["first"], skipped["rule"]) == (
        "fold",
        "2026-10-25T02:30:00",
        "dst.fold = first: runs at the first occurrence",
    )


def test_check_config_text_lists_the_repeated_quarter_hours_and_a_skipped_time(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path / "claimd.toml", jobs=JOBS)
    result = check_config(path, "--from", "2026-10-25T00:00Z", "--count", "5")
    assert result.returncode == 0, result.stderr
    block = result.stdout.split("quarter: ", 1)[1].splitlines()[1:6]
    # The example: 00:45Z is followed by 01:00Z (02:00 again, +01:00), not 02:00Z.
    assert [line.split()[0] for line in block] == [
        "2026-10-25T00:15:00+00:00",
        "2026-10-25T00:30:00+00:00",
        "2026-10-25T00:45:00+00:00",
        "2026-10-25T01:00:00+00:00",
        "2026-10-25T01:15:00+00:00",
    ]
    assert block[3].endswith(
        "[dst fold 2 of 2, offset +01:00: wildcard minute/hour: runs at both occurrences]"
    )

    spring = check_config(path, "--from", "2026-03-28T12:00Z", "--count", "2")
    assert spring.returncode == 0, spring.stderr
    lines = spring.stdout.split("at-0230-both: ", 1)[1].splitlines()
    assert lines[3] == (
        "  skipped 2026-03-29T02:30:00 (1 slot, dst gap at 2026-03-29T01:00:00+00:00): "
        "dst.gap = skip: does not run"
    )
    default = spring.stdout.split("at-0230: ", 1)[1].splitlines()
    assert default[1] == (
        "  2026-03-29T01:00:00+00:00  2026-03-29T03:00:00+02:00  "
        "[dst gap, offset +02:00: dst.gap = shift: runs at the end of the gap]"
    )

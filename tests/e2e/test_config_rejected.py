"""A job the config file rejects is seen everywhere, through the real `claimd` entry points.

A new job with a bad cron, and a broken edit of a job that runs: `claimd jobs` (a
separate process, through the database and through the API), `/api/status`,
`/api/jobs` and `/metrics` name them, with the error and whether the old
definition keeps running, after a start and after a refused reload; a reload of
the fixed file clears them.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import ClaimdProcess, eventually, http_port_of, scrape_metrics
from tests.e2e.test_cli import EXIT_MARGIN_S, GRACE_S, run_config, spawn
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
__all__ = ["spawn"]  # the fixture, shared with test_cli

TICK = '[jobs.tick]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n\n'
NIGHTLY = '[jobs.nightly]\ncron = "{cron}"\nrun = {{ shell = ["/bin/true"] }}\n\n'
NEW_BAD = '[jobs.newbad]\ncron = "61 * * * *"\nrun = { shell = ["/bin/true"] }\n\n'
REJECTED = 'claimd_config_job_rejected{claimd_job="%s"}'


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


def rejected_lines(text: str) -> dict[str, str]:
    """The lines under 'rejected by the config file', by job."""
    _, _, tail = text.partition("rejected by the config file")
    return {line.split(":", 1)[0].strip(): line for line in tail.splitlines()[1:] if line.strip()}


async def started(replica: ClaimdProcess) -> int:
    async def up() -> bool:
        assert replica.returncode() is None, replica.stderr()[-3000:]
        return bool(replica.events("replica started"))

    await eventually(up, timeout=45, what="the replica to start")
    port = http_port_of(replica)
    assert port is not None
    return port


async def _metrics_say(port: int, name: str, value: float) -> None:
    """Wait for /metrics to show ``value``: a page is rendered at most once a second, so
    a scrape within a second of the last one may show the page before a reload."""

    async def shown() -> bool:
        return (await asyncio.to_thread(scrape_metrics, port)).get(name) == value

    await eventually(shown, timeout=10, what=f"/metrics to say {name} {value}")


async def test_rejected_jobs_are_listed_by_the_cli_the_api_and_a_metric(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    path = tmp_path / "claimd.toml"
    config = run_config(
        path, schema_url, nats_url, deployment, TICK + NIGHTLY.format(cron="0 2 * * *") + NEW_BAD
    )
    pid_file = tmp_path / "claimd.pid"
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file))
    port = await started(replica)
    db = ("--database-url", schema_url)

    # At start: the new job with a bad cron is rejected and never runs.
    async def listed() -> bool:
        return "newbad" in rejected_lines((await claimd("jobs", *db)).out)

    await eventually(listed, timeout=30, what="claimd jobs to list the rejected job")
    jobs = await claimd("jobs", *db)
    assert jobs.code == 0, jobs
    line = rejected_lines(jobs.out)["newbad"]
    assert "field 'cron'" in line, jobs.out
    assert line.endswith("-- not running"), jobs.out
    assert scrape_metrics(port)[REJECTED % "newbad"] == 1

    # A broken edit of a job that runs: the reload is refused, the old definition
    # keeps running, and both jobs are on record (the metric was 0 here before).
    config.write_text(
        config.read_text().replace('cron = "0 2 * * *"', 'cron = "0 25 * * *"'), "utf-8"
    )
    refused = await claimd("reload", *db, "--pid-file", str(pid_file))
    assert refused.code == 1, refused
    for how in (db, ("--url", f"http://127.0.0.1:{port}")):
        jobs = await claimd("jobs", *how)
        assert jobs.code == 0, jobs
        lines = rejected_lines(jobs.out)
        assert set(lines) == {"newbad", "nightly"}, jobs.out
        assert lines["nightly"].endswith("-- the old definition keeps running"), jobs.out
        assert "field 'cron'" in lines["nightly"], jobs.out
        assert lines["newbad"].endswith("-- not running"), jobs.out
        table = jobs.out.partition("rejected by the config file")[0]
        nightly_row = next(r for r in table.splitlines() if r.startswith("nightly "))
        assert nightly_row.rstrip().endswith("active, edit rejected"), table
        newbad_row = next(r for r in table.splitlines() if r.startswith("newbad "))
        assert newbad_row.rstrip().endswith("rejected"), table
    await _metrics_say(port, "claimd_config_job_errors", 2)
    metrics = scrape_metrics(port)
    assert (metrics[REJECTED % "newbad"], metrics[REJECTED % "nightly"]) == (1, 1)
    assert metrics["claimd_config_job_errors"] == 2
    status = await asyncio.to_thread(get_json, port, "/api/status")
    assert {r["job"]: r["old_definition_running"] for r in status["config_rejected"]} == {
        "newbad": False,
        "nightly": True,
    }
    assert all(r["path"] == str(config) and r["error"] for r in status["config_rejected"])
    api_jobs = {j["name"]: j for j in await asyncio.to_thread(get_json, port, "/api/jobs")}
    assert api_jobs["nightly"]["config_rejected"]["field"] == "cron"
    assert api_jobs["nightly"]["schedule"] == "cron '0 2 * * *' in UTC"  # the old one runs
    assert api_jobs["tick"]["config_rejected"] is None

    # Started again on the broken file: the same record, from the start-up load.
    replica.terminate()
    assert await replica.wait(GRACE_S + EXIT_MARGIN_S) == 0, replica.stderr()[-3000:]
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file), label="again")
    port = await started(replica)
    metrics = scrape_metrics(port)
    assert (metrics[REJECTED % "newbad"], metrics[REJECTED % "nightly"]) == (1, 1)
    lines = rejected_lines((await claimd("jobs", *db)).out)
    assert lines["nightly"].endswith("-- the old definition keeps running"), lines

    # Fixed and reloaded: nothing rejected, anywhere.
    config.write_text(
        config.read_text()
        .replace('cron = "0 25 * * *"', 'cron = "0 3 * * *"')
        .replace(NEW_BAD, ""),
        "utf-8",
    )
    fixed = await claimd("reload", *db, "--pid-file", str(pid_file))
    assert fixed.code == 0, fixed
    jobs = await claimd("jobs", *db)
    assert "rejected" not in jobs.out, jobs.out
    await _metrics_say(port, "claimd_config_job_errors", 0)
    metrics = scrape_metrics(port)
    assert not [k for k in metrics if k.startswith("claimd_config_job_rejected{")]
    assert metrics["claimd_config_job_errors"] == 0
    status = await asyncio.to_thread(get_json, port, "/api/status")
    assert status["config_rejected"] == []
    replica.terminate()
    assert await replica.wait(GRACE_S + EXIT_MARGIN_S) == 0, replica.stderr()[-3000:]


async def test_a_later_refusal_for_another_reason_replaces_the_first_ones_job_error(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    """Refused for a job's error, then for the file as a whole (not TOML) with that job
    fixed: the second refusal is what `claimd reload`, `claimd jobs`, the status and the
    metrics say; the first one's job error is gone from all of them."""
    config = run_config(
        tmp_path / "claimd.toml",
        schema_url,
        nats_url,
        deployment,
        TICK + NIGHTLY.format(cron="0 2 * * *"),
    )
    pid_file = tmp_path / "claimd.pid"
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file))
    port = await started(replica)
    db = ("--database-url", schema_url)
    good = config.read_text()

    # First refusal: a job's error, on record everywhere.
    config.write_text(good.replace('cron = "0 2 * * *"', 'cron = "0 25 * * *"'), "utf-8")
    first = await claimd("reload", *db, "--pid-file", str(pid_file))
    assert first.code == 1, first
    assert "field 'cron'" in first.err, first
    assert "nightly" in rejected_lines((await claimd("jobs", *db)).out)
    await _metrics_say(port, REJECTED % "nightly", 1)

    # Second refusal, another reason: the job is fixed, the file as a whole is not TOML.
    config.write_text(good.replace('cron = "0 2 * * *"', 'cron = "0 3 * * *"') + "[jobs.\n")
    second = await claimd("reload", *db, "--pid-file", str(pid_file))
    assert second.code == 1, second
    assert "not valid TOML" in second.err, second
    assert "cron" not in second.err, second
    for how in (db, ("--url", f"http://127.0.0.1:{port}")):
        jobs = await claimd("jobs", *how)
        assert jobs.code == 0, jobs
        assert rejected_lines(jobs.out) == {}, jobs.out
        assert "25 is out of range" not in jobs.out, jobs.out
    status = await asyncio.to_thread(get_json, port, "/api/status")
    assert status["config_rejected"] == [], status["config_rejected"]
    await _metrics_say(port, "claimd_config_file_refused", 1)
    metrics = scrape_metrics(port)
    assert not [k for k in metrics if k.startswith("claimd_config_job_rejected{")], metrics
    assert metrics["claimd_config_job_errors"] == 0
    # The jobs of the last good load run on: nightly's old definition.
    api_jobs = {j["name"]: j for j in await asyncio.to_thread(get_json, port, "/api/jobs")}
    assert api_jobs["nightly"]["schedule"] == "cron '0 2 * * *' in UTC"

    # Fixed: reloaded, and nothing refused any more.
    config.write_text(good.replace('cron = "0 2 * * *"', 'cron = "0 3 * * *"'), "utf-8")
    fixed = await claimd("reload", *db, "--pid-file", str(pid_file))
    assert fixed.code == 0, fixed
    await _metrics_say(port, "claimd_config_file_refused", 0)
    replica.terminate()
    assert await replica.wait(GRACE_S + EXIT_MARGIN_S) == 0, replica.stderr()[-3000:]

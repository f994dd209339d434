"""The page, `claimd jobs` and /metrics say the same state for each job, on a live replica.

A job's state is decided once (actors/domain/job_state.py); the API returns it,
the page shows it, the command prints it and ``claimd_job_state`` exposes it.
One replica on PostgreSQL and NATS holds a job in each state:

- running: its first run (``sleep``) is running, none has finished;
- failing: its last finished run failed;
- overdue: a run due a minute ago has not started (claimed by a worker that
  never starts it, its lease far off, so no reaper takes it back);
- paused: an operator paused it;
- rejected: the config file rejected its last edit (its old definition runs);
- healthy: the control, nothing wrong.

The page is read in headless Chromium (Debian's chromium, as
test_status_page.py), the command through the real `claimd jobs`, /metrics
over HTTP.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.e2e.helpers import child_env, claimd_command
from tests.integration.helpers import eventually, running
from tests.integration.test_status_page import DEADLINE_MS, FAST, _browser_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(180)]

YEARLY = 'cron = "0 0 1 1 *"'  # nothing of its own due during the test
JOBS = f"""
[jobs.long-first-run]
{YEARLY}
run = {{ shell = ["sleep", "120"] }}

[jobs.breaks]
{YEARLY}
max_attempts = 1
run = {{ shell = ["sh", "-c", "echo 'disk full' >&2; exit 3"] }}

[jobs.stalled]
{YEARLY}
run = {{ shell = ["true"] }}

[jobs.held]
{YEARLY}
run = {{ shell = ["true"] }}

[jobs.edited]
{YEARLY}
run = {{ shell = ["true"] }}

[jobs.fine]
{YEARLY}
run = {{ shell = ["true"] }}
"""
EXPECTED = {
    "long-first-run": "running",
    "breaks": "failing",
    "stalled": "overdue",
    "held": "paused",
    "edited": "rejected",
    "fine": "healthy",
}
_STATE_SAMPLE = re.compile(r'^claimd_job_state\{claimd_job="([^"]+)",state="([^"]+)"\} 1\.0$')


async def _now_run(store: PostgresRunStore, job: str) -> None:
    """A run of ``job`` due now (as `claimd trigger` writes one): the replica starts it."""
    await store.pool.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger)"
        " SELECT id, now(), now(), 'manual' FROM jobs WHERE name = $1",
        job,
    )


async def _states(store: PostgresRunStore) -> None:
    """Put each job in its state, through the rows a real run or action leaves."""
    await _now_run(store, "long-first-run")
    await _now_run(store, "breaks")
    await store.pool.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at, state, claim_epoch, lease_owner,"
        "                      lease_expires_at, claimed_at)"
        " SELECT id, now() - interval '1 minute', now() - interval '1 minute', 'claimed', 1,"
        "        'a-worker-that-never-starts-it', now() + interval '1 hour', now()"
        "   FROM jobs WHERE name = 'stalled'"
    )
    await store.pool.execute("UPDATE jobs SET paused = true WHERE name = 'held'")
    await store.pool.execute(
        "INSERT INTO config_rejected_jobs (job, path, field, error, replica)"
        " VALUES ('edited', 'claimd.toml', 'every', 'not a duration', 'elsewhere')"
    )


async def _command_states(schema_url: str) -> dict[str, str]:
    """What `claimd jobs` prints in its STATE column, by job."""
    proc = await asyncio.create_subprocess_exec(
        *claimd_command(),
        "jobs",
        "--database-url",
        schema_url,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split()[-1] == "STATE", lines[0]
    found = {}
    for line in lines[1:]:
        if not line.strip() or line.startswith(("config in force", "rejected by")):
            break  # the config lines below the table
        cells = re.split(r"\s{2,}", line.strip())
        found[cells[0]] = cells[-1]
    return found


async def _metric_states(base: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
        text = await response.text()
    return {
        m.group(1): m.group(2)
        for line in text.splitlines()
        if (m := _STATE_SAMPLE.match(line)) is not None
    }


async def test_the_page_the_command_and_the_metrics_agree_on_each_jobs_state(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    schema_url: str,
    tmp_path: Path,
) -> None:
    async_playwright, executable = _browser_or_skip()
    # The running job's sleep is ended at the stop, not waited for.
    config = make_config(JOBS, shutdown_grace="1s", **FAST)
    replica = Replica(tmp_path / "claimd.toml", config)
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, what="the replica's HTTP server")

        async def synced() -> bool:
            return await store.pool.fetchval("SELECT count(*) FROM jobs") == len(EXPECTED)

        await eventually(synced, what="the config's jobs in the catalog")
        await _states(store)

        async def settled() -> bool:
            rows = await store.pool.fetch(
                "SELECT j.name, r.state FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE j.name IN ('long-first-run', 'breaks')"
            )
            return {(r["name"], r["state"]) for r in rows} == {
                ("long-first-run", "running"),
                ("breaks", "failed"),
            }

        await eventually(settled, timeout=30, what="the first run running, the other failed")
        base = f"http://127.0.0.1:{replica.http_port}"

        # /metrics: one state per job at 1 (the cluster gauges are read at most once a second).
        async def metrics_agree() -> bool:
            return await _metric_states(base) == EXPECTED

        await eventually(metrics_agree, timeout=10, what="claimd_job_state of every job")
        assert await _metric_states(base) == EXPECTED
        assert await _command_states(schema_url) == EXPECTED

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                await page.goto(f"{base}/?refresh=1")
                await page.wait_for_function(
                    "n => document.querySelectorAll('#jobs tr.job-row[data-state]').length === n",
                    arg=len(EXPECTED),
                    timeout=DEADLINE_MS,
                )
                shown = await page.eval_on_selector_all(
                    "#jobs tr.job-row",
                    "rows => rows.map(r => [r.dataset.job, r.dataset.state])",
                )
            finally:
                await browser.close()
        assert dict(shown) == EXPECTED

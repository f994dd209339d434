"""Python jobs through `claimd run` on real PostgreSQL and NATS.

- A sync job that outlives its timeout is killed before its next attempt
  starts: no two executions of one run are ever alive together.
- An async job that blocks its event loop (time.sleep in an async def) holds
  neither the worker's loop nor other jobs' instants; the watchdog names it.
- What a python job prints and logs is kept per attempt, and `claimd show` and
  the API list it attempt by attempt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from tests.integration.helpers import Replicas, claimd_command, eventually, free_port, scrape

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RARE_CRON = "0 0 1 1 *"  # never due inside a test: the test inserts the run it wants


async def _job_known(store: PostgresRunStore, name: str) -> None:
    async def known() -> bool:
        return bool(await store.pool.fetchval("SELECT count(*) FROM jobs WHERE name = $1", name))

    await eventually(known, timeout=30)


async def _insert_run(store: PostgresRunStore, name: str) -> str:
    return str(
        await store.pool.fetchval(
            "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) "
            "SELECT id, now(), now(), 'manual' FROM jobs WHERE name = $1 RETURNING id",
            name,
        )
    )


async def _until_state(store: PostgresRunStore, run_id: str, state: str, timeout: float) -> None:
    async def reached() -> bool:
        found = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1::uuid", run_id)
        return bool(found == state)

    await eventually(reached, timeout=timeout)


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_sync_job_past_its_timeout_is_dead_before_its_next_attempt_starts(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """Timeout 2 s, sleeps 6 s, three attempts: each attempt is killed (it never notes
    its end) and finds no earlier execution of its run alive when it starts."""
    make_config(
        f"""
        [jobs.overstay]
        cron = "{RARE_CRON}"
        timeout = "2s"
        max_attempts = 3
        backoff = {{ initial = "100ms", max = "200ms" }}
        run = {{ python = "tests.e2e.python_exec_jobs:sleeps_past_its_timeout" }}
        """,
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    effects = tmp_path / "effects"
    replicas = Replicas(tmp_path)
    try:
        await replicas.start(
            tmp_path / "claimd.toml", "r1", PYJOBS_EFFECTS=str(effects), PYJOBS_SLEEP_S="6"
        )
        await _job_known(store, "overstay")
        run_id = await _insert_run(store, "overstay")
        await _until_state(store, run_id, "failed", timeout=60)
        # A thread left running would note its end 6 s after its start: give it the time.
        first_start = float(next(w for w in _lines(effects) if w[0] == "start")[4])
        await eventually(
            lambda: _after(first_start + 6.5), timeout=15, what="6.5 s after the first start"
        )
    finally:
        await replicas.stop_all()
    lines = _lines(effects)
    starts = [w for w in lines if w[0] == "start"]
    assert [int(w[2]) for w in starts] == [1, 2, 3], lines
    # No execution noted its end: each was killed at its timeout, none ran on.
    assert [w for w in lines if w[0] == "end"] == []
    # Each start found no earlier execution of its run alive (its pid list is empty).
    assert [w[5:] for w in starts] == [[], [], []], lines
    assert len({w[3] for w in starts}) == 3  # three processes, one per attempt
    outcomes = [
        r["outcome"]
        for r in await store.pool.fetch(
            "SELECT outcome FROM job_run_attempts WHERE run_id = $1::uuid ORDER BY attempt",
            run_id,
        )
    ]
    assert outcomes == ["timed_out"] * 3


async def test_sync_runs_through_a_replica_reuse_one_warm_process(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """Three runs of a sync job, one after another, through `claimd run` with one warm
    process: all three ran in it (no fork per run), and not in the replica."""
    make_config(
        f"""
        [jobs.reused]
        cron = "{RARE_CRON}"
        run = {{ python = "tests.e2e.python_exec_jobs:notes_its_process" }}
        """,
        claim_interval="50ms",
        materialize_interval="200ms",
        python_processes=1,
    )
    effects = tmp_path / "effects"
    replicas = Replicas(tmp_path)
    try:
        proc = await replicas.start(tmp_path / "claimd.toml", "r1", PYJOBS_EFFECTS=str(effects))
        await _job_known(store, "reused")
        for _ in range(3):
            run_id = await _insert_run(store, "reused")
            await _until_state(store, run_id, "succeeded", timeout=60)
    finally:
        await replicas.stop_all()
    pids = {int(w[3]) for w in _lines(effects) if w[0] == "ran"}
    assert len(_lines(effects)) == 3
    assert len(pids) == 1, _lines(effects)
    assert proc.pid not in pids


async def _after(moment: float) -> bool:
    return time.time() >= moment


async def test_an_async_job_that_blocks_its_loop_delays_no_other_job(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """`blocker` calls time.sleep(8) in an async def; `ticker` (every second, a sync
    job) begins each run on time meanwhile, once each, nothing redelivered; the
    watchdog names `blocker`. The worker's loop (starts, heartbeats) goes on; the
    async jobs share the one job loop with the blocker (docs/python-execution.md)."""
    port = free_port()
    make_config(
        f"""
        [jobs.blocker]
        cron = "{RARE_CRON}"
        timeout = "30s"
        run = {{ python = "tests.e2e.python_exec_jobs:blocks_its_loop" }}

        [jobs.ticker]
        every = "1s"
        run = {{ python = "tests.e2e.python_exec_jobs:ticks_sync" }}
        """,
        claim_interval="50ms",
        materialize_interval="200ms",
        http=f"127.0.0.1:{port}",
    )
    effects = tmp_path / "effects"
    replicas = Replicas(tmp_path)
    try:
        await replicas.start(
            tmp_path / "claimd.toml", "r1", PYJOBS_EFFECTS=str(effects), PYJOBS_SLEEP_S="8"
        )

        async def ticking(count: int) -> bool:
            return sum(w[0] == "tick" for w in _lines(effects)) >= count

        await eventually(lambda: ticking(3), timeout=40, what="the ticker's first runs")
        await _job_known(store, "blocker")
        run_id = await _insert_run(store, "blocker")

        async def blocker_ended() -> bool:
            return any(w[0] == "blocker-end" for w in _lines(effects))

        await eventually(blocker_ended, timeout=40, what="the blocker's end")
        ended = sum(w[0] == "tick" for w in _lines(effects))
        await eventually(lambda: ticking(ended + 2), timeout=20, what="ticks after the block")
        await _until_state(store, run_id, "succeeded", timeout=20)
        blocked = await scrape(port, "claimd_job_loop_blocked_seconds_total", claimd_job="blocker")
        redelivered = await scrape(port, "claimd_redeliveries_total")
    finally:
        await replicas.stop_all()
    lines = _lines(effects)
    block_start = float(next(w for w in lines if w[0] == "blocker-start")[4])
    block_end = float(next(w for w in lines if w[0] == "blocker-end")[4])
    assert block_end - block_start >= 7.5
    ticks = [w for w in lines if w[0] == "tick"]
    during = [
        (datetime.fromisoformat(w[4]) - datetime.fromisoformat(w[3])).total_seconds()
        for w in ticks
        if block_start <= datetime.fromisoformat(w[3]).timestamp() <= block_end - 1
    ]
    assert len(during) >= 5, ticks  # the ticker kept its instants through the block ...
    assert max(during) < 3.0, during  # ... each begun on time (not up to 8 s late)
    run_ids = [w[1] for w in ticks]
    assert len(run_ids) == len(set(run_ids))  # none executed twice
    assert redelivered == 0
    not_first = await store.pool.fetchval(
        "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = 'ticker' AND (r.attempt > 1 OR r.state = 'failed')"
    )
    assert not_first == 0
    # The watchdog named the job, in the log and in the metric.
    assert blocked >= 5.0
    log_lines = [
        json.loads(line)
        for line in (tmp_path / "r1.log").read_text().splitlines()
        if line.startswith("{")
    ]
    named = [e for e in log_lines if e.get("event", "").startswith("job event loop blocked")]
    assert named, "no watchdog warning in the log"
    assert named[0]["job"] == "blocker"
    assert named[0]["run_id"] == run_id


async def test_a_python_jobs_output_is_listed_per_attempt(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    schema_url: str,
    tmp_path: Path,
) -> None:
    """Each attempt's printed and logged lines (and its traceback) in `claimd show` and
    in /api/runs/{id}: a retry no longer overwrites what the attempt before it said."""
    port = free_port()
    make_config(
        f"""
        [jobs.talker]
        cron = "{RARE_CRON}"
        max_attempts = 3
        backoff = {{ initial = "100ms", max = "200ms" }}
        run = {{ python = "tests.e2e.python_exec_jobs:talks_then_fails_twice" }}
        """,
        claim_interval="50ms",
        materialize_interval="200ms",
        http=f"127.0.0.1:{port}",
    )
    replicas = Replicas(tmp_path)
    try:
        await replicas.start(tmp_path / "claimd.toml", "r1")
        await _job_known(store, "talker")
        run_id = await _insert_run(store, "talker")
        await _until_state(store, run_id, "succeeded", timeout=60)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/api/runs/{run_id}") as response,
        ):
            assert response.status == 200
            answer = await response.json()
    finally:
        await replicas.stop_all()
    attempts = sorted(answer["attempts"], key=lambda a: a["attempt"])
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    for a in attempts:
        n = a["attempt"]
        tail = a["output_tail"]
        assert f"printed by attempt {n}" in tail
        assert f"WARNING talker job=talker run_id={run_id}: logged by attempt {n}" in tail
        others = {1, 2, 3} - {n}
        assert not any(f"printed by attempt {m}" in tail for m in others)
        assert (f"planned failure of attempt {n}" in tail) is (n < 3)
    proc = await asyncio.create_subprocess_exec(
        *claimd_command(),
        "show",
        run_id,
        "--database-url",
        schema_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    for n in (1, 2, 3):
        section = text.split(f"output of attempt {n} ")[1].split("output of attempt")[0]
        assert f"printed by attempt {n}" in section
        assert f"WARNING talker job=talker run_id={run_id}: logged by attempt {n}" in section

"""Heartbeats on the real servers, with a short test lease.

A run five times longer than its lease is neither reaped nor redelivered (its
lease and its JetStream ack deadline are kept alive); the same run on a worker
killed mid-run stops heartbeating and is recovered by another replica after
the lease.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import nats
import psutil
import pytest
from prometheus_client import REGISTRY

from actors.adapters.nats import CONSUMER
from actors.adapters.postgres import Operations, PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.e2e.helpers import ClaimdProcess, child_env
from tests.integration.helpers import RARE_CRON, counter, eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LEASE_S = 2.0
# lease 2s > ack_wait x (max_deliver - 1) x 3 = 1.8s: inside the invariant, and short.
# Heartbeats come every min(lease/4, ack_wait/2) = 300ms.
SETTINGS = {
    "lease": "2s",
    "ack_wait": "600ms",
    "max_deliver": 2,
    "claim_interval": "50ms",
    "materialize_interval": "200ms",
    "reap_interval": "200ms",
    "shutdown_grace": "2s",
}
RUN_S = 5 * LEASE_S


def _long_job(effects: Path) -> str:
    """A shell job that runs 5 x the lease and logs its start (with its pid) and end."""
    script = (
        f'echo "start $CLAIMD_RUN_ID $CLAIMD_ATTEMPT $$" >> {effects}; sleep {RUN_S:g}; '
        f'echo "end $CLAIMD_RUN_ID $CLAIMD_ATTEMPT" >> {effects}'
    )
    return f"""
        [jobs.long]
        cron = "{RARE_CRON}"
        timeout = "60s"
        max_attempts = 3
        run = {{ shell = '{script}', use_shell = true }}
    """


def _effects(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def _reaped_total() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "claimd_runs_reaped":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


async def _num_redelivered(nats_url: str, deployment: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(f"CLAIMD_{deployment}", CONSUMER)
        return int(info.num_redelivered or 0)
    finally:
        await nc.close()


async def _run(store: PostgresRunStore, run_id: str) -> asyncpg.Record:
    row = await store.pool.fetchrow(
        "SELECT state, attempt, lease_owner, started_at, finished_at FROM job_runs "
        "WHERE id = $1::uuid",
        run_id,
    )
    assert row is not None
    return row


async def _attempts(store: PostgresRunStore, run_id: str) -> list[tuple[int, str, str]]:
    rows = await store.pool.fetch(
        "SELECT attempt, outcome, worker FROM job_run_attempts WHERE run_id = $1::uuid "
        "ORDER BY attempt",
        run_id,
    )
    return [(r["attempt"], r["outcome"], r["worker"]) for r in rows]


async def _wait_succeeded(store: PostgresRunStore, run_id: str, timeout: float) -> None:
    async def done() -> bool:
        return (await _run(store, run_id))["state"] in ("succeeded", "failed")

    await eventually(done, timeout=timeout, what=f"run {run_id} to end")


async def test_run_five_times_the_lease_is_neither_reaped_nor_redelivered(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    tmp_path: Path,
    nats_url: str,
    deployment: str,
) -> None:
    effects = tmp_path / "effects.txt"
    loaded = make_config(_long_job(effects), **SETTINGS)
    await store.sync_jobs(list(loaded.jobs.values()))
    reaped_before = _reaped_total()
    redelivered_before = counter("claimd_redeliveries_total")
    replica = Replica(Path(loaded.path), loaded)
    async with running(replica):
        run_id = await Operations(store.pool).trigger("long", datetime.now(UTC))
        assert run_id is not None
        await _wait_succeeded(store, run_id, timeout=60)
        redelivered = await _num_redelivered(nats_url, deployment)

    row = await _run(store, run_id)
    assert (row["state"], row["attempt"]) == ("succeeded", 1)
    # The setup is what makes this meaningful: the run outlived its lease five times.
    assert row["finished_at"] - row["started_at"] >= timedelta(seconds=RUN_S)
    assert await _attempts(store, run_id) == [(1, "succeeded", replica.replica_id)]
    assert _reaped_total() == reaped_before
    assert counter("claimd_redeliveries_total") == redelivered_before
    assert redelivered == 0
    assert [e[:3] for e in _effects(effects)] == [["start", run_id, "1"], ["end", run_id, "1"]]


async def test_worker_killed_mid_run_is_recovered_after_the_lease_by_another_replica(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    loaded = make_config(_long_job(effects), **SETTINGS)
    await store.sync_jobs(list(loaded.jobs.values()))
    doomed = ClaimdProcess(
        ["run", "--config", loaded.path], tmp_path, "doomed", env=child_env()
    ).start()
    job_procs: list[psutil.Process] = []
    try:
        run_id = await Operations(store.pool).trigger("long", datetime.now(UTC))
        assert run_id is not None

        async def started_there() -> bool:
            return any(e[0] == "start" for e in _effects(effects))

        await eventually(started_there, timeout=40, what="the run to start on the subprocess")
        job_shell = psutil.Process(int(_effects(effects)[0][3]))
        job_procs = [job_shell, *job_shell.children(recursive=True)]
        owner = (await _run(store, run_id))["lease_owner"]
        assert (await _run(store, run_id))["state"] == "running"
        assert owner is not None
        assert f":{doomed.pid}:" in owner
        # The machine dies: the worker and its job, at once, without any goodbye.
        os.killpg(doomed.pid, signal.SIGKILL)
        for proc in job_procs:
            proc.kill()
        await doomed.wait(10)

        rescuer = Replica(Path(loaded.path), loaded)
        async with running(rescuer):
            await _wait_succeeded(store, run_id, timeout=60)
    finally:
        doomed.kill()
        for proc in job_procs:  # psutil checks the start time: never a reused pid
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()

    row = await _run(store, run_id)
    assert (row["state"], row["attempt"]) == ("succeeded", 2)
    assert await _attempts(store, run_id) == [
        (1, "lease_expired", owner),
        (2, "succeeded", rescuer.replica_id),
    ]
    assert [e[:3] for e in _effects(effects)] == [
        ["start", run_id, "1"],
        ["start", run_id, "2"],
        ["end", run_id, "2"],
    ]

"""Expired leases: the reaper recovers a killed worker's run, and a zombie records nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion
from actors.scheduling.reaper import Reaper
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    Replicas,
    add_job,
    eventually,
    insert_due_runs,
    make_job,
    message_for,
)

pytestmark = pytest.mark.integration

EXPIRED = "UPDATE job_runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1"


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    started = Replicas(tmp_path)
    yield started
    await started.stop_all()


async def test_worker_killed_mid_run_is_reaped_and_run_again_once(
    store: PostgresRunStore,
    broker: JetStreamBroker,
    tmp_path: Path,
    make_config: Callable[..., LoadedConfig],
    replicas: Replicas,
) -> None:
    executions = tmp_path / "executions"
    pgid_file = tmp_path / "pgid"
    # Attempt 1 hangs (its shell's pid, the process group, is written down so the
    # orphan can be killed); attempt 2 returns at once.
    command = (
        f'echo "$CLAIMD_ATTEMPT" >> {executions}; '
        f'if [ "$CLAIMD_ATTEMPT" = 1 ]; then echo $$ > {pgid_file}; exec sleep 30; fi'
    )
    loaded = make_config(
        f"""
        [jobs.slow]
        cron = "{RARE_CRON}"
        max_attempts = 3
        run = {{ shell = '{command}', use_shell = true }}
        """,
        lease="3s",
        ack_wait="500ms",
        max_deliver=2,
        claim_interval="50ms",
        reap_interval="100ms",
        materialize_interval="1s",
        shutdown_grace="1s",
    )
    config = tmp_path / "claimd.toml"
    job_id = await add_job(store, loaded.jobs["slow"])
    [run_id] = await insert_due_runs(store, job_id, 1)

    first = await replicas.start(config, "first")

    async def running_attempt_1() -> bool:
        state = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", run_id)
        return state == "running" and pgid_file.exists() and pgid_file.read_text().strip() != ""

    pgid = 0
    try:
        await eventually(running_attempt_1, timeout=40, what="attempt 1 running")
        pgid = int(pgid_file.read_text())
        first.send_signal(signal.SIGKILL)
        await first.wait()
    finally:
        if pgid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    row = await store.pool.fetchrow(
        "SELECT state, attempt, claim_epoch FROM job_runs WHERE id = $1", run_id
    )
    assert (row["state"], row["attempt"], row["claim_epoch"]) == ("running", 1, 1)

    # A second replica: its reaper finds the lease expired, its worker runs attempt 2.
    await replicas.start(config, "second")

    async def finished() -> bool:
        state = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", run_id)
        return state in ("succeeded", "failed")

    await eventually(finished, timeout=40, what="the run finished by the second replica")
    row = await store.pool.fetchrow(
        "SELECT state, attempt, claim_epoch FROM job_runs WHERE id = $1", run_id
    )
    assert (row["state"], row["attempt"], row["claim_epoch"]) == ("succeeded", 2, 2)
    attempts = await store.pool.fetch(
        "SELECT attempt, claim_epoch, outcome FROM job_run_attempts WHERE run_id = $1"
        " ORDER BY attempt",
        run_id,
    )
    assert [tuple(a) for a in attempts] == [(1, 1, "lease_expired"), (2, 2, "succeeded")]
    assert executions.read_text().split() == ["1", "2"]


async def test_expired_claim_goes_back_to_pending_with_the_same_attempt(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job())
    [run_id] = await insert_due_runs(store, job_id, 1)
    await store.claim_due_runs("gone", 1, LONG_LEASE, max_claimed=10)
    reaper = Reaper(store, timedelta(seconds=1), asyncio.Event())
    assert await reaper.reap_once() == 0  # a live lease is left alone

    await store.pool.execute(EXPIRED, run_id)
    assert await reaper.reap_once() == 1
    row = await store.pool.fetchrow(
        "SELECT state, attempt, lease_owner, claim_epoch FROM job_runs WHERE id = $1", run_id
    )
    assert tuple(row) == ("pending", 1, None, 1)
    # It never started: no attempt is recorded.
    assert await store.pool.fetchval("SELECT count(*) FROM job_run_attempts") == 0
    [again] = await store.claim_due_runs("alive", 1, LONG_LEASE, max_claimed=10)
    assert (again.run_id, again.epoch, again.attempt) == (run_id, 2, 1)


async def test_reaped_run_fences_the_zombie_and_fails_at_the_attempt_limit(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job(max_attempts=1))
    [run_id] = await insert_due_runs(store, job_id, 1)
    [run] = await store.claim_due_runs("replica", 1, LONG_LEASE, max_claimed=10)
    started, _ = await store.start_runs("zombie", [message_for(run, "d")], LONG_LEASE)
    assert [s.run_id for s in started] == [run_id]

    await store.pool.execute(EXPIRED, run_id)
    reaped = await store.reap_expired_leases(10)
    assert reaped == [(run_id, "job", "running->failed")]
    row = await store.pool.fetchrow(
        "SELECT state, outcome, finished_at IS NOT NULL AS done FROM job_runs WHERE id = $1", run_id
    )
    assert tuple(row) == ("failed", "lease_expired", True)

    # The worker that lost its lease finishes anyway: its verdict is refused.
    late = Completion(run_id, run.epoch, ExecutionResult(Outcome.SUCCEEDED), None, "zombie")
    assert await store.complete_runs([late]) == set()
    assert await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", run_id) == "failed"
    attempts = await store.pool.fetch(
        "SELECT attempt, outcome, worker FROM job_run_attempts WHERE run_id = $1", run_id
    )
    assert [tuple(a) for a in attempts] == [(1, "lease_expired", "zombie")]

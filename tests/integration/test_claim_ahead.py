"""Start lag on the real servers: claimed ahead, held until the instant, woken without polling.

- START_RUNS starts no claimed run before it is due on the database's clock
  (the worker is told "early"), whatever the claim or the worker's clock did.
- A replica claims a run before its instant, and its worker starts it at (not
  before) the instant.
- With a claim interval of an hour, a run due in a few seconds and a run
  triggered now are both claimed: the claimer wakes at the next due instant
  and on the NOTIFY of a new pending run, not at its poll.
- A run claimed ahead and not yet started stays within reach: a pause hands
  it back to pending, a schedule change withdraws it, removing its job
  cancels it; its message then starts nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from actors.adapters.postgres import Operations, PostgresRunStore
from actors.adapters.postgres.statements import CLAIM_DUE_RUNS
from actors.config import LoadedConfig
from actors.domain import CronSchedule
from actors.ports import DispatchMessage
from actors.replica import Replica
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    add_job,
    eventually,
    insert_due_runs,
    make_job,
    message_for,
    running,
)

pytestmark = pytest.mark.integration

JOBS = f"""
[jobs.held]
cron = "{RARE_CRON}"
run = {{ python = "tests.integration.helpers:record_call" }}
"""
# A poll so slow that only a wake can explain a claim inside a test.
NO_POLL = {"claim_interval": "1h", "materialize_interval": "200ms"}

INSERT_RUN_IN = """
INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger)
SELECT j.id, now() + $2::interval, now() + $2::interval, $3 FROM jobs j WHERE j.name = $1
RETURNING id::text
"""


async def _job_synced(store: PostgresRunStore, name: str = "held") -> None:
    async def synced() -> bool:
        return bool(await store.pool.fetchval("SELECT count(*) FROM jobs WHERE name = $1", name))

    await eventually(synced, what="the job synced")


async def _succeeded(store: PostgresRunStore, run_id: str) -> None:
    async def done() -> bool:
        state = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", run_id)
        return bool(state == "succeeded")

    await eventually(done, what=f"run {run_id} succeeded")


async def test_start_runs_refuses_a_claimed_run_not_yet_due(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job())
    run_id = await store.pool.fetchval(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at) "
        "VALUES ($1, now() + interval '1 hour', now() + interval '1 hour') RETURNING id::text",
        job_id,
    )
    assert await store.claim_due_runs("me", 10, LONG_LEASE, 100) == []
    next_due = await store.next_due_in(timedelta(0))
    assert next_due is not None
    assert timedelta(minutes=59) < next_due <= timedelta(hours=1)
    assert await store.next_due_in(timedelta(hours=2)) is None  # claimable now: the poll's

    [run] = await store.claim_due_runs("me", 10, LONG_LEASE, 100, ahead=timedelta(hours=2))
    assert run.run_id == run_id
    assert run.due_at is not None
    message = message_for(run, "d")
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert started == []
    assert [(r.run_id, r.reason) for r in refused] == [(run_id, "early")]
    row = await store.pool.fetchrow("SELECT state, started_at FROM job_runs WHERE id = $1", run_id)
    assert (row["state"], row["started_at"]) == ("claimed", None)

    # Its instant comes (moved here rather than waited for): now it starts.
    await store.pool.execute("UPDATE job_runs SET due_at = now() WHERE id = $1", run_id)
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert [s.run_id for s in started] == [run_id]
    assert refused == []


async def test_a_run_claimed_ahead_starts_at_not_before_its_instant(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    loaded = make_config(JOBS, claim_ahead="1s", **NO_POLL)
    async with running(Replica(tmp_path / "claimd.toml", loaded)):
        await _job_synced(store)
        run_id = await store.pool.fetchval(INSERT_RUN_IN, "held", timedelta(seconds=3), "schedule")

        async def claimed_before_its_instant() -> bool:
            return bool(
                await store.pool.fetchval(
                    "SELECT state = 'claimed' AND now() < due_at FROM job_runs WHERE id = $1",
                    run_id,
                )
            )

        await eventually(claimed_before_its_instant, what="the run claimed ahead")
        await _succeeded(store, run_id)
    row = await store.pool.fetchrow(
        "SELECT started_at, scheduled_at, due_at FROM job_runs WHERE id = $1", run_id
    )
    # On the database's clock: START_RUNS writes started_at = now().
    assert row["started_at"] >= row["due_at"] == row["scheduled_at"]
    attempts = await store.pool.fetchval(
        "SELECT count(*) FROM job_run_attempts WHERE run_id = $1", run_id
    )
    assert attempts == 1


async def test_a_triggered_run_wakes_the_claimer_without_waiting_for_its_poll(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    loaded = make_config(JOBS, **NO_POLL)
    async with running(Replica(tmp_path / "claimd.toml", loaded)):
        await _job_synced(store)
        first = await store.pool.fetchval(INSERT_RUN_IN, "held", timedelta(0), "manual")
        await _succeeded(store, first)
        # The claimer now rests for its hour; only the NOTIFY can wake it.
        second = await store.pool.fetchval(INSERT_RUN_IN, "held", timedelta(0), "manual")
        await _succeeded(store, second)


async def test_the_listener_survives_its_connection_being_killed_and_listens_again(
    store: PostgresRunStore,
) -> None:
    """A dead LISTEN connection is an outage to wait out, never a crash.

    Seen in the network chaos run: after a reset link, cleaning up the dead
    connection raised (asyncpg had released it to the pool already), the
    supervisor counted six crashes in a minute and the replica exited.
    """
    from datetime import datetime

    from actors.adapters.postgres.notify import PendingRunsListener

    calls: list[datetime] = []
    listener = PendingRunsListener(store.pool, calls.append)
    stop = asyncio.Event()
    task = asyncio.create_task(listener.run(stop))
    try:
        for round_ in range(3):

            async def listening(n: int = round_ + 1) -> bool:
                return len(calls) >= n and bool(
                    await store.pool.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                    )
                )

            await eventually(listening, what=f"the listener listening (round {round_ + 1})")
            killed = await store.pool.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%' "
                "AND pid <> pg_backend_pid()"
            )
            assert killed >= 1
            assert not task.done(), task  # still running: waited out, not raised
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)  # ends on stop, without an error


async def _claimed_ahead(store: PostgresRunStore, job_id: int) -> tuple[str, DispatchMessage]:
    """A run of the job an hour ahead, claimed now (as claim_ahead would, nearer its instant)."""
    run_id = await store.pool.fetchval(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at) "
        "VALUES ($1, now() + interval '1 hour', now() + interval '1 hour') RETURNING id::text",
        job_id,
    )
    [run] = await store.claim_due_runs("me", 10, LONG_LEASE, 100, ahead=timedelta(hours=2))
    assert run.run_id == run_id
    return run_id, message_for(run, "d")


async def _state(store: PostgresRunStore, run_id: str) -> str | None:
    state: str | None = await store.pool.fetchval(
        "SELECT state FROM job_runs WHERE id = $1", run_id
    )
    return state


async def test_a_pause_hands_back_a_run_claimed_ahead_and_its_message_starts_nothing(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job("paused"))
    run_id, message = await _claimed_ahead(store, job_id)
    running_id = (await insert_due_runs(store, job_id, 1))[0]
    [due] = await store.claim_due_runs("me", 10, LONG_LEASE, 100)
    assert due.run_id == running_id
    [begun], _ = await store.start_runs("worker", [message_for(due, "d")], LONG_LEASE)

    await Operations(store.pool).pause("paused")
    assert await _state(store, run_id) == "pending"
    assert await _state(store, begun.run_id) == "running"  # a started run finishes
    # Its instant comes while paused: the old message starts nothing.
    await store.pool.execute("UPDATE job_runs SET due_at = now() WHERE id = $1", run_id)
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert started == []
    assert [(r.run_id, r.reason) for r in refused] == [(run_id, "stale")]
    assert await store.claim_due_runs("me", 10, LONG_LEASE, 100) == []

    await Operations(store.pool).resume("paused")
    [again] = await store.claim_due_runs("me", 10, LONG_LEASE, 100)
    assert (again.run_id, again.epoch) == (run_id, message.epoch + 1)


async def test_a_schedule_change_withdraws_a_run_claimed_ahead_of_the_old_schedule(
    store: PostgresRunStore,
) -> None:
    job = make_job("moved")
    job_id = await add_job(store, job)
    run_id, message = await _claimed_ahead(store, job_id)

    await store.sync_jobs([replace(job, schedule=CronSchedule("7 3 * * *", "UTC"))])
    assert await _state(store, run_id) is None
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert started == []
    assert [(r.run_id, r.reason) for r in refused] == [(run_id, "unknown")]


async def test_removing_a_job_cancels_its_run_claimed_ahead(store: PostgresRunStore) -> None:
    job_id = await add_job(store, make_job("removed"))
    run_id, message = await _claimed_ahead(store, job_id)

    await store.sync_jobs([])
    row = await store.pool.fetchrow(
        "SELECT state, error, lease_owner FROM job_runs WHERE id = $1", run_id
    )
    assert tuple(row) == ("cancelled", "job removed from config", None)
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert started == []
    assert [(r.run_id, r.reason) for r in refused] == [(run_id, "terminal")]


async def test_a_claim_not_yet_committed_when_the_pause_was_starts_nothing(
    store: PostgresRunStore,
) -> None:
    """The pause cannot see a claim still in flight; the start sees the pause."""
    job_id = await add_job(store, make_job("racing"))
    [run_id] = await insert_due_runs(store, job_id, 1)
    async with store.pool.acquire() as conn:
        claim = conn.transaction()
        await claim.start()
        # The claim has read the job unpaused and locked the pending row...
        [row] = await conn.fetch(CLAIM_DUE_RUNS, "me", 10, LONG_LEASE, timedelta(0))
        # ...the pause commits meanwhile (the row is pending in its snapshot)...
        await Operations(store.pool).pause("racing")
        await claim.commit()  # ...and the claim commits a claimed run of a paused job.
    assert await _state(store, run_id) == "claimed"
    message = DispatchMessage(
        run_id, row["claim_epoch"], "racing", row["scheduled_at"], row["attempt"], "d"
    )
    started, refused = await store.start_runs("worker", [message], LONG_LEASE)
    assert started == []
    assert [(r.run_id, r.reason) for r in refused] == [(run_id, "stale")]
    assert await _state(store, run_id) == "pending"
    await Operations(store.pool).resume("racing")
    [again] = await store.claim_due_runs("me", 10, LONG_LEASE, 100)
    assert (again.run_id, again.epoch) == (run_id, message.epoch + 1)

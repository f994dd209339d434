"""Policies that forbid a run hold at the claim and at the start, whatever ran before.

The skip pass (``skip_unrunnable``) runs before each claim, but nothing orders
it against the clock: a deadline can pass, or a newer instant become due,
just after it ran. These tests force those interleavings by driving the store
directly: the claim is called without the skip pass, and a claimed run's
clock is moved (its instant put back) before it is started.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.domain import (
    Catchup,
    ClaimedRun,
    CronSchedule,
    Job,
    Overlap,
    PythonSpec,
    RunState,
    StartRefusal,
)
from actors.ports import NotStarted
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    add_job,
    calls_of,
    consumer_counts,
    counter,
    eventually,
    jetstream_worker,
    message_for,
)

pytestmark = pytest.mark.integration

DEADLINE = timedelta(seconds=30)
MISSED = "missed its starting deadline"
SUPERSEDED = "superseded by a later instant (catchup = latest)"
INSERT_RUN = """
INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger, attempt)
VALUES ($1, now() - $2::interval, now() - $2::interval, $3, $4)
RETURNING id::text
"""


def _job(name: str, *, overlap: Overlap = Overlap.ALLOW, catchup: Catchup = Catchup.ALL) -> Job:
    return Job(
        name=name,
        schedule=CronSchedule(RARE_CRON, "UTC"),
        executor=PythonSpec("tests.integration.helpers:record_call"),
        overlap=overlap,
        catchup=catchup,
        starting_deadline=DEADLINE,
    )


async def _insert(
    store: PostgresRunStore,
    job_id: int,
    ago: timedelta,
    *,
    trigger: str = "schedule",
    attempt: int = 1,
) -> str:
    run_id: str = await store.pool.fetchval(INSERT_RUN, job_id, ago, trigger, attempt)
    return run_id


async def _claim_all(store: PostgresRunStore) -> list[ClaimedRun]:
    """A few claims in a row: an exclusive job yields (or skips) one run per claim."""
    claimed: list[ClaimedRun] = []
    for _ in range(3):
        claimed += await store.claim_due_runs("replica", 10, LONG_LEASE, max_claimed=100)
    return claimed


async def _row(store: PostgresRunStore, run_id: str) -> dict[str, object]:
    row = await store.pool.fetchrow(
        "SELECT state, outcome, error, claim_epoch, lease_owner, lease_expires_at, started_at,"
        " finished_at IS NOT NULL AS finished,"
        " (SELECT count(*) FROM job_run_attempts a WHERE a.run_id = r.id) AS attempts"
        " FROM job_runs r WHERE id = $1::uuid",
        run_id,
    )
    assert row is not None
    return dict(row)


def _skipped(reason: str, epoch: int) -> dict[str, object]:
    return {
        "state": "skipped",
        "outcome": "skipped",
        "error": reason,
        "claim_epoch": epoch,
        "lease_owner": None,
        "lease_expires_at": None,
        "started_at": None,
        "finished": True,
        "attempts": 0,
    }


# --- at the claim -----------------------------------------------------------------------


@pytest.mark.parametrize("overlap", list(Overlap), ids=[o.value for o in Overlap])
async def test_claim_without_the_skip_pass_never_claims_a_run_past_its_deadline(
    store: PostgresRunStore, overlap: Overlap
) -> None:
    # The interleaving: the skip pass ran just before this run's deadline passed,
    # then the claim runs. Calling the claim alone is exactly that.
    job_id = await add_job(store, _job("deadline", overlap=overlap))
    late = await _insert(store, job_id, timedelta(minutes=5))
    on_time = await _insert(store, job_id, timedelta(seconds=1))

    claimed = await _claim_all(store)

    assert [r.run_id for r in claimed] == [on_time]
    assert await _row(store, late) == _skipped(MISSED, 0)


@pytest.mark.parametrize("overlap", [Overlap.ALLOW, Overlap.QUEUE], ids=["allow", "queue"])
async def test_claim_without_the_skip_pass_never_claims_a_superseded_latest_run(
    store: PostgresRunStore, overlap: Overlap
) -> None:
    job_id = await add_job(store, _job("latest", overlap=overlap, catchup=Catchup.LATEST))
    older = await _insert(store, job_id, timedelta(seconds=20))
    newer = await _insert(store, job_id, timedelta(seconds=10))

    claimed = await _claim_all(store)

    assert [r.run_id for r in claimed] == [newer]
    assert await _row(store, older) == _skipped(SUPERSEDED, 0)


async def test_the_deadline_and_supersede_rules_exempt_triggers_retries_and_other_policies(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, _job("exempt"))
    manual = await _insert(store, job_id, timedelta(minutes=5), trigger="manual")
    retry = await _insert(store, job_id, timedelta(minutes=6), attempt=2)
    # catchup = all: an older instant is not superseded by a newer one.
    older = await _insert(store, job_id, timedelta(seconds=2))
    newer = await _insert(store, job_id, timedelta(seconds=1))

    claimed = await _claim_all(store)

    assert {r.run_id for r in claimed} == {manual, retry, older, newer}
    started, not_started = await store.start_runs(
        "worker", [message_for(r, "d") for r in claimed], LONG_LEASE
    )
    assert {s.run_id for s in started} == {manual, retry, older, newer}
    assert not_started == []


# --- at the start -----------------------------------------------------------------------


async def _claim_one(store: PostgresRunStore, run_id: str) -> ClaimedRun:
    [run] = await store.claim_due_runs("replica", 10, LONG_LEASE, max_claimed=100)
    assert run.run_id == run_id
    return run


async def test_a_claimed_run_whose_deadline_passes_in_the_stream_is_skipped_at_start(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, _job("deadline"))
    run_id = await _insert(store, job_id, timedelta(seconds=1))
    run = await _claim_one(store, run_id)
    # The run waits in the stream (workers down) until its deadline has passed.
    await store.pool.execute(
        "UPDATE job_runs SET scheduled_at = scheduled_at - interval '5 minutes'"
        " WHERE id = $1::uuid",
        run_id,
    )

    started, not_started = await store.start_runs("worker", [message_for(run, "d")], LONG_LEASE)

    assert started == []
    assert not_started == [NotStarted(run_id, run.epoch, StartRefusal.SKIPPED, RunState.SKIPPED)]
    assert await _row(store, run_id) == _skipped(MISSED, run.epoch)


async def test_a_claimed_latest_run_superseded_while_in_the_stream_is_skipped_at_start(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, _job("latest", catchup=Catchup.LATEST))
    older = await _insert(store, job_id, timedelta(seconds=10))
    newer = await _insert(store, job_id, -timedelta(hours=1))  # not due yet
    run = await _claim_one(store, older)
    # The next instant comes due while the claimed run still waits to be started.
    await store.pool.execute(
        "UPDATE job_runs SET scheduled_at = now() - interval '1 second', due_at = now()"
        " WHERE id = $1::uuid",
        newer,
    )

    started, not_started = await store.start_runs("worker", [message_for(run, "d")], LONG_LEASE)

    assert started == []
    assert not_started == [NotStarted(older, run.epoch, StartRefusal.SKIPPED, RunState.SKIPPED)]
    assert await _row(store, older) == _skipped(SUPERSEDED, run.epoch)
    assert (await _row(store, newer))["state"] == "pending"


async def test_a_run_already_started_is_taken_up_again_after_its_deadline(
    store: PostgresRunStore,
) -> None:
    # The start committed (inside the deadline) but its reply was lost; the
    # redelivered message finds the run running under this worker.
    job_id = await add_job(store, _job("deadline"))
    run_id = await _insert(store, job_id, timedelta(seconds=1))
    run = await _claim_one(store, run_id)
    [first], _ = await store.start_runs("worker", [message_for(run, "d")], LONG_LEASE)
    await store.pool.execute(
        "UPDATE job_runs SET scheduled_at = scheduled_at - interval '5 minutes'"
        " WHERE id = $1::uuid",
        run_id,
    )

    [again], not_started = await store.start_runs(
        "worker", [message_for(run, "d")], LONG_LEASE, retake={(run.run_id, run.epoch)}
    )

    assert not_started == []
    assert (again.run_id, again.epoch) == (first.run_id, first.epoch)
    assert (await _row(store, run_id))["state"] == "running"


# --- through the worker, on real JetStream ----------------------------------------------


async def test_worker_acks_a_delivery_skipped_at_start_and_executes_nothing(
    store: PostgresRunStore, broker: JetStreamBroker, nats_url: str, deployment: str
) -> None:
    job_id = await add_job(store, _job("deadline"))
    run_id = await _insert(store, job_id, timedelta(seconds=1))
    run = await _claim_one(store, run_id)
    assert await broker.publish_many([message_for(run, deployment)]) == [None]
    await store.pool.execute(
        "UPDATE job_runs SET scheduled_at = scheduled_at - interval '5 minutes'"
        " WHERE id = $1::uuid",
        run_id,
    )
    skipped_before = counter("claimd_deliveries_skipped_total", reason="skipped")

    connection = await JetStreamBroker.connect(
        nats_url, broker.stream, broker.subject, name="worker-1"
    )
    stop = asyncio.Event()
    worker = await jetstream_worker(
        store,
        connection,
        deployment,
        stop,
        worker_id="worker-1",
    )
    task = asyncio.create_task(worker.run())
    try:

        async def skipped() -> bool:
            return counter("claimd_deliveries_skipped_total", reason="skipped") > skipped_before

        async def settled() -> bool:
            return await consumer_counts(broker) == (0, 0)

        await eventually(skipped, what="the delivery judged at start")
        await eventually(settled, what="the delivery acked")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
        await connection.close()

    assert calls_of(run_id) == []
    assert await _row(store, run_id) == _skipped(MISSED, run.epoch)
    assert counter("claimd_deliveries_skipped_total", reason="skipped") == skipped_before + 1

"""Claims: oldest due first, within the batch and the in-flight bound, disjoint, exclusive."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from actors.domain import ExecutionResult, Outcome, Overlap, RunState
from actors.ports import Completion, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Rows


async def test_a_claim_takes_the_oldest_due_first_within_the_batch_and_the_bound(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    by_age = {minutes: await rows.insert("job", ago(60 * minutes)) for minutes in (3, 1, 2, 4)}
    future = await rows.insert("job", timedelta(minutes=1))
    first = await store.claim_due_runs("a", 2, LEASE, max_claimed=3)
    assert [c.run_id for c in sorted(first, key=lambda c: c.scheduled_at)] == [by_age[4], by_age[3]]
    second = await store.claim_due_runs("b", 5, LEASE, max_claimed=3)
    assert [c.run_id for c in second] == [by_age[2]]  # 3 claimed in all: the bound
    assert all(c.epoch == 1 and c.attempt == 1 and c.job == "job" for c in first + second)
    assert await store.claim_due_runs("c", 5, LEASE, max_claimed=3) == []
    row = await rows.row(by_age[4])
    assert row is not None
    assert (row.state, row.lease_owner, row.epoch) == (RunState.CLAIMED, "a", 1)
    assert row.lease_expires_at is not None
    future_row = await rows.row(future)
    assert future_row is not None
    assert future_row.state is RunState.PENDING


async def test_two_claimers_at_once_get_disjoint_batches(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs([job()])
    runs = {await rows.insert("job", ago(60 - i)) for i in range(12)}
    a, b = await asyncio.gather(
        store.claim_due_runs("a", 8, LEASE, max_claimed=100),
        store.claim_due_runs("b", 8, LEASE, max_claimed=100),
    )
    mine, theirs = {c.run_id for c in a}, {c.run_id for c in b}
    assert not mine & theirs
    assert mine | theirs == runs
    assert len(mine) + len(theirs) == 12


async def test_a_run_due_within_claim_ahead_is_claimed_and_next_due_in_sees_past_it(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    soon = await rows.insert("job", timedelta(seconds=2))
    later = await rows.insert("job", timedelta(seconds=60))
    assert await store.claim_due_runs("a", 10, LEASE, 100) == []
    wait = await store.next_due_in(timedelta(0))
    assert wait is not None
    assert timedelta(seconds=1) < wait <= timedelta(seconds=2)
    [claimed] = await store.claim_due_runs("a", 10, LEASE, 100, ahead=timedelta(seconds=5))
    assert claimed.run_id == soon
    wait = await store.next_due_in(timedelta(seconds=5))
    assert wait is not None
    assert timedelta(seconds=59) < wait <= timedelta(seconds=60)
    assert (await rows.row(later)) is not None
    assert await store.next_due_in(timedelta(minutes=2)) is None


async def test_an_exclusive_job_has_one_run_claimed_or_running_at_a_time(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job("queued", overlap=Overlap.QUEUE), job("free")])
    first, second = await rows.insert("queued", ago(20)), await rows.insert("queued", ago(10))
    free = {await rows.insert("free", ago(15)), await rows.insert("free", ago(5))}
    claimed = await store.claim_due_runs("a", 10, LEASE, 100)
    assert {c.run_id for c in claimed} == free | {first}
    assert await store.claim_due_runs("b", 10, LEASE, 100) == []
    [run] = [c for c in claimed if c.run_id == first]
    started, _ = await store.start_runs("w", [message(run)], LEASE)
    assert [s.run_id for s in started] == [first]
    assert await store.claim_due_runs("b", 10, LEASE, 100) == []  # running still counts
    done = Completion(first, run.epoch, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await store.complete_runs([done]) == {(first, run.epoch)}
    [next_one] = await store.claim_due_runs("b", 10, LEASE, 100)
    assert next_one.run_id == second


async def test_runs_of_paused_and_removed_jobs_are_not_claimed(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job("paused"), job("kept"), job("removed")])
    paused = await rows.insert("paused", ago(5))
    kept = await rows.insert("kept", ago(5))
    await rows.insert("removed", ago(5))
    await rows.set_paused("paused", True)
    await store.sync_jobs([job("paused"), job("kept")])
    assert [c.run_id for c in await store.claim_due_runs("a", 10, LEASE, 100)] == [kept]
    await rows.set_paused("paused", False)
    assert [c.run_id for c in await store.claim_due_runs("a", 10, LEASE, 100)] == [paused]

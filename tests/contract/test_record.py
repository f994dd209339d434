"""After the start: heartbeats, completions under the epoch fence, a stop's hand-back."""

from __future__ import annotations

from datetime import timedelta

from actors.domain import (
    ClaimedRun,
    ExecutionResult,
    Outcome,
    RetryPolicy,
    RunState,
    decide_attempt,
)
from actors.ports import Completion, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Row, Rows


async def _running(store: ReplicaStore, rows: Rows, worker: str = "w") -> ClaimedRun:
    run_id = await rows.insert("job", ago(5))
    [run] = [c for c in await store.claim_due_runs("c", 10, LEASE, 100) if c.run_id == run_id]
    started, _ = await store.start_runs(worker, [message(run)], LEASE)
    assert [s.run_id for s in started] == [run_id]
    return run


async def _row(rows: Rows, run_id: str) -> Row:
    row = await rows.row(run_id)
    assert row is not None
    return row


async def test_a_heartbeat_extends_only_this_workers_running_run_under_its_epoch(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run = await _running(store, rows)
    key = (run.run_id, run.epoch)
    before = (await _row(rows, run.run_id)).lease_expires_at
    await rows.later()
    assert await store.extend_leases("w", [key], LEASE * 2) == {key}
    after = (await _row(rows, run.run_id)).lease_expires_at
    assert before is not None
    assert after is not None
    assert after > before
    assert await store.extend_leases("x", [key], LEASE) == set()  # another worker
    assert await store.extend_leases("w", [(run.run_id, run.epoch + 1)], LEASE) == set()
    claimed_id = await rows.insert("job", ago(1))
    [claimed] = await store.claim_due_runs("c", 10, LEASE, 100)
    assert claimed.run_id == claimed_id
    assert await store.extend_leases("c", [(claimed_id, claimed.epoch)], LEASE) == set()


async def test_a_zombie_completing_a_run_reaped_claimed_and_started_again_is_refused(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job(max_attempts=3)])
    run = await _running(store, rows, "zombie")
    bystander = await _running(store, rows, "zombie")
    await rows.expire_lease(run.run_id)
    assert await store.reap_expired_leases(10) == [(run.run_id, "job", "running->pending")]
    [again] = await store.claim_due_runs("c", 10, LEASE, 100)
    assert (again.run_id, again.epoch, again.attempt) == (run.run_id, 2, 2)
    started, _ = await store.start_runs("alive", [message(again)], LEASE)
    assert [s.run_id for s in started] == [run.run_id]
    before = await _row(rows, run.run_id)
    assert (before.state, before.attempt, before.epoch, before.lease_owner) == (
        RunState.RUNNING,
        2,
        2,
        "alive",
    )
    ok = ExecutionResult(Outcome.SUCCEEDED)
    late = Completion(run.run_id, 1, ok, None, "zombie")
    current = Completion(bystander.run_id, bystander.epoch, ok, None, "zombie")
    assert await store.complete_runs([late, current]) == {(bystander.run_id, bystander.epoch)}
    assert await _row(rows, run.run_id) == before
    assert await rows.attempts(run.run_id) == [(1, 1, "lease_expired", "zombie")]
    assert (await _row(rows, bystander.run_id)).state is RunState.SUCCEEDED
    # The zombie's heartbeat is refused too; the newer attempt completes under its epoch.
    assert await store.extend_leases("zombie", [(run.run_id, 1)], LEASE) == set()
    mine = Completion(run.run_id, 2, ExecutionResult(Outcome.FAILED, error="boom"), None, "alive")
    assert await store.complete_runs([mine]) == {(run.run_id, 2)}
    assert await rows.attempts(run.run_id) == [
        (1, 1, "lease_expired", "zombie"),
        (2, 2, "failed", "alive"),
    ]


async def test_a_completion_records_nothing_for_a_run_that_is_not_running(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", ago(5))
    [claimed] = await store.claim_due_runs("c", 10, LEASE, 100)
    ok = Completion(run_id, claimed.epoch, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await store.complete_runs([ok]) == set()
    assert (await _row(rows, run_id)).state is RunState.CLAIMED
    assert await rows.attempts(run_id) == []


async def test_a_completion_applies_the_domains_verdict(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs([job(max_attempts=3)])
    run = await _running(store, rows)
    verdict = decide_attempt(
        Outcome.FAILED,
        state=RunState.RUNNING,
        attempt=1,
        max_attempts=3,
        policy=None,
        run_id=run.run_id,
    )
    assert verdict.retry
    assert verdict.attempt == 2
    failed = ExecutionResult(Outcome.FAILED, exit_code=2, error="boom", output_tail="out")
    key = (run.run_id, run.epoch)
    assert await store.complete_runs([Completion(*key, failed, verdict, "w")]) == {key}
    row = await _row(rows, run.run_id)
    assert (row.state, row.attempt, row.epoch, row.lease_owner) == (RunState.PENDING, 2, 1, None)
    assert (row.started_at, row.finished_at, row.outcome, row.error) == (
        None,
        None,
        "failed",
        "boom",
    )
    assert await rows.attempts(run.run_id) == [(1, 1, "failed", "w")]
    assert await store.complete_runs([Completion(*key, failed, verdict, "w")]) == set()


async def test_a_stop_hands_back_only_this_workers_runs_with_their_attempt(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job(max_attempts=1)])
    run = await _running(store, rows)
    key = (run.run_id, run.epoch)
    assert await store.interrupt_runs("someone-else", [key]) == 0
    assert await store.interrupt_runs("w", [(run.run_id, run.epoch + 1)]) == 0
    assert await store.interrupt_runs("w", [key]) == 1
    row = await _row(rows, run.run_id)
    assert (row.state, row.attempt, row.lease_owner, row.started_at) == (
        RunState.PENDING,
        1,
        None,
        None,
    )
    assert await rows.attempts(run.run_id) == [(1, 1, "interrupted", "w")]
    assert await store.interrupt_runs("w", [key]) == 0
    [again] = await store.claim_due_runs("c", 10, LEASE, 100)
    assert (again.run_id, again.epoch, again.attempt) == (run.run_id, 2, 1)


async def test_a_failed_attempt_is_due_again_only_after_its_backoff(
    store: ReplicaStore, rows: Rows
) -> None:
    """The retry's due_at is the store's now plus the verdict's delay, never the old due_at."""
    await store.sync_jobs([job(max_attempts=3)])
    run = await _running(store, rows)
    backoff = timedelta(minutes=10)
    verdict = decide_attempt(
        Outcome.FAILED,
        state=RunState.RUNNING,
        attempt=1,
        max_attempts=3,
        policy=RetryPolicy(backoff, backoff, 1.0),
        run_id=run.run_id,
    )
    assert verdict.due_in is not None
    assert verdict.due_in >= backoff * 0.8
    before = await _row(rows, run.run_id)
    failed = ExecutionResult(Outcome.FAILED, exit_code=1, error="boom")
    key = (run.run_id, run.epoch)
    assert await store.complete_runs([Completion(*key, failed, verdict, "w")]) == {key}
    row = await _row(rows, run.run_id)
    assert (row.state, row.attempt) == (RunState.PENDING, 2)
    # Due a backoff after the completion: later than the old due_at by (nearly)
    # all of it, and not claimable now.
    assert row.due_at - before.due_at >= verdict.due_in
    assert await store.claim_due_runs("c", 10, LEASE, 100) == []
    assert await store.next_due_in(timedelta(0)) is not None

"""What the reaper and the compensator hand back: expired leases, unpublished claims,
orphaned runs, history past its retention."""

from __future__ import annotations

from datetime import timedelta

from actors.domain import ExecutionResult, Outcome, RunState
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import Completion, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Row, Rows


async def _row(rows: Rows, run_id: str) -> Row:
    row = await rows.row(run_id)
    assert row is not None
    return row


async def test_an_expired_claim_goes_back_pending_with_its_attempt_and_no_attempt_row(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    expired, alive = await rows.insert("job", ago(10)), await rows.insert("job", ago(5))
    await store.claim_due_runs("c", 10, LEASE, 100)
    await rows.expire_lease(expired)
    assert await store.reap_expired_leases(10) == [(expired, "job", "claimed->pending")]
    row = await _row(rows, expired)
    assert (row.state, row.attempt, row.epoch, row.lease_owner) == (RunState.PENDING, 1, 1, None)
    assert await rows.attempts(expired) == []
    assert (await _row(rows, alive)).state is RunState.CLAIMED  # its lease holds


async def test_a_lost_worker_costs_an_attempt_and_the_last_one_fails_the_run(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job(max_attempts=2)])
    run_id = await rows.insert("job", ago(5))
    transitions = []
    for worker in ("w1", "w2"):
        [run] = await store.claim_due_runs("c", 10, LEASE, 100)
        started, _ = await store.start_runs(worker, [message(run)], LEASE)
        assert [s.run_id for s in started] == [run_id]
        await rows.expire_lease(run_id)
        transitions += [t for _, _, t in await store.reap_expired_leases(10)]
    assert transitions == ["running->pending", "running->failed"]
    row = await _row(rows, run_id)
    assert (row.state, row.attempt, row.outcome, row.error) == (
        RunState.FAILED,
        2,
        "lease_expired",
        "lease expired on w2",
    )
    assert (row.lease_owner, row.lease_expires_at, row.started_at) == (None, None, None)
    assert row.finished_at is not None
    assert await rows.attempts(run_id) == [
        (1, 1, "lease_expired", "w1"),
        (2, 2, "lease_expired", "w2"),
    ]


async def test_the_reaper_takes_the_longest_expired_first_within_its_limit(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    first, second = await rows.insert("job", ago(10)), await rows.insert("job", ago(5))
    await store.claim_due_runs("c", 10, LEASE, 100)
    await rows.expire_lease(second)
    await rows.later()
    await rows.expire_lease(first)  # expired later on the clock: the second is older
    assert [r for r, _, _ in await store.reap_expired_leases(1)] == [second]
    assert [r for r, _, _ in await store.reap_expired_leases(1)] == [first]
    assert await store.reap_expired_leases(1) == []


async def test_a_release_hands_back_only_this_owners_claim_under_its_epoch(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", ago(5))
    claimed = await store.claim_due_runs("a", 10, LEASE, 100)
    assert await store.release_unpublished("b", claimed) == 0
    assert await store.release_unpublished("a", claimed) == 1
    row = await _row(rows, run_id)
    assert (row.state, row.lease_owner, row.lease_expires_at, row.epoch) == (
        RunState.PENDING,
        None,
        None,
        1,
    )
    assert await store.release_unpublished("a", claimed) == 0  # pending now
    [again] = await store.claim_due_runs("a", 10, LEASE, 100)
    assert again.epoch == 2
    assert await store.release_unpublished("a", claimed) == 0  # the older epoch
    await store.start_runs("w", [message(again)], LEASE)
    assert await store.release_unpublished("a", [again]) == 0  # running: not a claim


async def test_runs_of_a_removed_job_that_come_back_pending_are_cancelled(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job("gone"), job("kept")])
    gone, kept = await rows.insert("gone", ago(5)), await rows.insert("kept", ago(5))
    claimed = {c.run_id: c for c in await store.claim_due_runs("c", 10, LEASE, 100)}
    await store.start_runs("w", [message(claimed[gone])], LEASE)
    await store.sync_jobs([job("kept")])  # running: it finishes
    assert (await _row(rows, gone)).state is RunState.RUNNING
    assert await store.cancel_orphaned_runs() == 0
    await rows.expire_lease(gone)
    await store.reap_expired_leases(10)  # back to pending: nothing claims it now
    assert await store.claim_due_runs("c", 10, LEASE, 100) == []
    assert await store.cancel_orphaned_runs() == 1
    row = await _row(rows, gone)
    assert (row.state, row.error) == (RunState.CANCELLED, REMOVED_FROM_CONFIG)
    assert (await _row(rows, kept)).state is RunState.CLAIMED


async def test_pruning_deletes_the_oldest_finished_history_first_in_batches(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    ids = [await rows.insert("job", ago(60 - i)) for i in range(3)]
    claimed = await store.claim_due_runs("c", 10, LEASE, 100)
    await store.start_runs("w", [message(c) for c in claimed], LEASE)
    ok = ExecutionResult(Outcome.SUCCEEDED)
    await store.complete_runs([Completion(c.run_id, c.epoch, ok, None, "w") for c in claimed])
    young, old, older = ids
    await rows.finished_ago(young, timedelta(hours=1))
    await rows.finished_ago(old, timedelta(days=2))
    await rows.finished_ago(older, timedelta(days=3))
    assert await store.prune_history(timedelta(days=1), batch=1) == 1
    assert [await rows.row(i) is None for i in ids] == [False, False, True]
    assert await store.prune_history(timedelta(days=1), batch=10) == 1
    assert await rows.row(old) is None
    assert await store.prune_history(timedelta(days=1), batch=10) == 0
    assert await rows.row(young) is not None

"""The start: claimed runs become running; every other message is told why not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from actors.domain import Catchup, ClaimedRun, ExecutionResult, Outcome, RunState, SkipReason
from actors.domain import StartRefusal as Why
from actors.ports import Completion, DispatchMessage, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Rows

SOME_INSTANT = datetime(2026, 1, 1, tzinfo=UTC)


async def _claimed(store: ReplicaStore, rows: Rows, name: str = "job") -> ClaimedRun:
    run_id = await rows.insert(name, ago(5))
    claimed = await store.claim_due_runs("claimer", 10, LEASE, 100)
    [run] = [c for c in claimed if c.run_id == run_id]
    return run


async def _why(store: ReplicaStore, m: DispatchMessage, worker: str = "w") -> tuple[Why, ...]:
    started, refused = await store.start_runs(worker, [m], LEASE)
    assert started == []
    return tuple(r.reason for r in refused)


async def test_a_claimed_run_starts_once_under_its_epoch(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs([job(max_attempts=4)])
    run = await _claimed(store, rows)
    [started], refused = await store.start_runs("w", [message(run)], LEASE)
    assert refused == []
    assert (started.run_id, started.epoch, started.attempt, started.max_attempts) == (
        run.run_id,
        1,
        1,
        4,
    )
    assert (started.job, started.trigger) == ("job", "schedule")
    row = await rows.row(run.run_id)
    assert row is not None
    assert (row.state, row.lease_owner) == (RunState.RUNNING, "w")
    assert row.started_at is not None


async def test_every_refusal_says_why(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs([job()])
    assert await _why(
        store, DispatchMessage(rows.unknown_run(), 1, "job", SOME_INSTANT, 1, "d")
    ) == (Why.UNKNOWN,)

    done = await _claimed(store, rows)
    await store.start_runs("w", [message(done)], LEASE)
    ok = Completion(done.run_id, done.epoch, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await store.complete_runs([ok]) == {(done.run_id, done.epoch)}
    assert await _why(store, message(done)) == (Why.TERMINAL,)

    released = await _claimed(store, rows)
    assert await store.release_unpublished("claimer", [released]) == 1
    assert await _why(store, message(released)) == (Why.STALE,)  # pending again
    [again] = await store.claim_due_runs("claimer", 10, LEASE, 100)
    assert (again.run_id, again.epoch) == (released.run_id, 2)
    assert await _why(store, message(released)) == (Why.STALE,)  # the older epoch

    owned = again
    await store.start_runs("w", [message(owned)], LEASE)
    assert await _why(store, message(owned)) == (Why.OWNED,)  # no retake asked


async def test_a_start_is_taken_up_again_only_by_its_worker_when_it_says_so(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run = await _claimed(store, rows)
    await store.start_runs("w", [message(run)], LEASE)
    key = {(run.run_id, run.epoch)}
    started, _ = await store.start_runs("w", [message(run)], LEASE, retake=key)
    assert [s.run_id for s in started] == [run.run_id]
    _, [other] = await store.start_runs("x", [message(run)], LEASE, retake=key)
    assert other.reason is Why.OWNED
    row = await rows.row(run.run_id)
    assert row is not None
    assert row.lease_owner == "w"


async def test_a_run_claimed_ahead_is_not_started_before_it_is_due(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", timedelta(seconds=30))
    [run] = await store.claim_due_runs("claimer", 10, LEASE, 100, ahead=timedelta(minutes=1))
    assert run.run_id == run_id
    _, [early] = await store.start_runs("w", [message(run)], LEASE)
    assert (early.reason, early.state) == (Why.EARLY, RunState.CLAIMED)
    row = await rows.row(run_id)
    assert row is not None
    assert (row.state, row.lease_owner) == (RunState.CLAIMED, "claimer")


async def test_a_claimed_run_past_its_deadline_at_the_start_is_skipped(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job(starting_deadline=timedelta(minutes=1))])
    run = await _claimed(store, rows)
    await rows.move_instant(run.run_id, -timedelta(minutes=5))  # it waited in the stream
    _, [skipped] = await store.start_runs("w", [message(run)], LEASE)
    assert (skipped.reason, skipped.state, skipped.epoch) == (Why.SKIPPED, RunState.SKIPPED, 1)
    row = await rows.row(run.run_id)
    assert row is not None
    assert (row.state, row.error, row.epoch) == (RunState.SKIPPED, SkipReason.DEADLINE_MISSED, 1)


async def test_a_claimed_latest_run_superseded_meanwhile_is_skipped_at_the_start(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job(catchup=Catchup.LATEST)])
    run = await _claimed(store, rows)
    newer = await rows.insert("job", ago(1))
    _, [skipped] = await store.start_runs("w", [message(run)], LEASE)
    assert skipped.reason is Why.SKIPPED
    row, newest = await rows.row(run.run_id), await rows.row(newer)
    assert row is not None
    assert (row.state, row.error) == (RunState.SKIPPED, SkipReason.SUPERSEDED)
    assert newest is not None
    assert newest.state is RunState.PENDING


async def test_a_claim_the_pause_did_not_see_is_handed_back_by_the_start(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    run = await _claimed(store, rows)
    await rows.pause_unseen("job")
    _, [refused] = await store.start_runs("w", [message(run)], LEASE)
    assert refused.reason is Why.STALE
    row = await rows.row(run.run_id)
    assert row is not None
    assert (row.state, row.lease_owner, row.epoch) == (RunState.PENDING, None, 1)


async def test_an_unreadable_definition_fails_its_own_attempt_only(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job("odd", max_attempts=1), job("good")])
    odd = await _claimed(store, rows, "odd")
    good = await _claimed(store, rows, "good")
    await rows.make_unreadable("odd")
    started, [refused] = await store.start_runs("w", [message(odd), message(good)], LEASE)
    assert [s.run_id for s in started] == [good.run_id]
    assert (refused.run_id, refused.reason) == (odd.run_id, Why.UNREADABLE)
    row = await rows.row(odd.run_id)
    assert row is not None
    assert (row.state, row.outcome) == (RunState.FAILED, "failed")
    assert row.error is not None
    assert "unreadable" in row.error
    assert await rows.attempts(odd.run_id) == [(1, 1, "failed", "w")]


async def test_a_stale_delivery_for_a_paused_job_leaves_a_newer_claim_alone(
    store: ReplicaStore, rows: Rows
) -> None:
    """The paused hand-back is guarded by the epoch as every transition is.

    Replica a claimed the run (epoch 1), its publish was released, replica b
    claimed it again (epoch 2), then a pause committed that b's claim read
    past. A late delivery of a's message (epoch 1) must not send b's claim
    back to pending: only b's own message hands it back.
    """
    await store.sync_jobs([job()])
    first = await _claimed(store, rows)
    assert await store.release_unpublished("claimer", [first]) == 1
    [second] = await store.claim_due_runs("b", 10, LEASE, 100)
    assert (second.run_id, second.epoch) == (first.run_id, 2)
    await rows.pause_unseen("job")
    _, [stale] = await store.start_runs("w", [message(first)], LEASE)
    assert stale.reason is Why.STALE
    row = await rows.row(first.run_id)
    assert row is not None
    assert (row.state, row.lease_owner, row.epoch) == (RunState.CLAIMED, "b", 2)
    _, [handed] = await store.start_runs("w", [message(second)], LEASE)
    assert handed.reason is Why.STALE
    row = await rows.row(first.run_id)
    assert row is not None
    assert (row.state, row.lease_owner, row.epoch) == (RunState.PENDING, None, 2)

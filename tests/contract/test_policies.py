"""Policies that forbid a run, and the catalog's changes that take runs back: the skip
pass, the claim's verdict, pause and resume, a schedule change, a removal."""

from __future__ import annotations

from datetime import timedelta

from actors.domain import Catchup, ExecutionResult, Outcome, Overlap, RunState, SkipReason
from actors.domain import StartRefusal as Why
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import Completion, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Row, Rows


async def _row(rows: Rows, run_id: str) -> Row:
    row = await rows.row(run_id)
    assert row is not None
    return row


async def test_the_skip_pass_records_each_policys_reason(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs(
        [
            job("late", starting_deadline=timedelta(seconds=30)),
            job("newest", catchup=Catchup.LATEST),
            job("single", overlap=Overlap.FORBID),
        ]
    )
    busy = await rows.insert("single", ago(30))
    [claimed] = await store.claim_due_runs("c", 10, LEASE, 100)
    assert claimed.run_id == busy  # active: the job's next due run must not run
    late = await rows.insert("late", ago(60))
    in_time = await rows.insert("late", ago(10))
    older = await rows.insert("newest", ago(120))
    newer = await rows.insert("newest", ago(60))
    waiting = await rows.insert("single", ago(20))
    skipped = dict(await store.skip_unrunnable(10))
    assert skipped == {
        late: SkipReason.DEADLINE_MISSED,
        older: SkipReason.SUPERSEDED,
        waiting: SkipReason.OVERLAP_FORBIDDEN,
    }
    for run_id, reason in skipped.items():
        row = await _row(rows, run_id)
        assert (row.state, row.outcome, row.error) == (RunState.SKIPPED, "skipped", reason)
        assert row.finished_at is not None
    assert (await _row(rows, in_time)).state is RunState.PENDING
    assert (await _row(rows, newer)).state is RunState.PENDING
    assert await store.skip_unrunnable(10) == []


async def test_the_claim_records_skipped_what_must_not_run_and_never_claims_it(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs(
        [
            job("late", starting_deadline=timedelta(seconds=30)),
            job("newest", catchup=Catchup.LATEST),
        ]
    )
    late = await rows.insert("late", ago(60))
    older = await rows.insert("newest", ago(120))
    newer = await rows.insert("newest", ago(60))
    triggered = await rows.insert("late", ago(90), trigger="manual")  # no deadline for it
    claimed = await store.claim_due_runs("c", 10, LEASE, 100)
    assert {c.run_id for c in claimed} == {newer, triggered}
    assert (await _row(rows, late)).error == SkipReason.DEADLINE_MISSED
    row = await _row(rows, older)
    assert (row.state, row.error, row.epoch) == (RunState.SKIPPED, SkipReason.SUPERSEDED, 0)


async def test_a_pause_hands_back_the_claims_and_lets_the_running_finish(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    running_id = await rows.insert("job", ago(10))
    claimed_id = await rows.insert("job", ago(5))
    claims = {c.run_id: c for c in await store.claim_due_runs("c", 10, LEASE, 100)}
    await store.start_runs("w", [message(claims[running_id])], LEASE)
    version = await store.catalog_version()
    await rows.set_paused("job", True)
    assert await store.catalog_version() != version
    row = await _row(rows, claimed_id)
    assert (row.state, row.lease_owner, row.epoch) == (RunState.PENDING, None, 1)
    assert (await _row(rows, running_id)).state is RunState.RUNNING
    _, [stale] = await store.start_runs("w", [message(claims[claimed_id])], LEASE)
    assert stale.reason is Why.STALE
    assert await store.claim_due_runs("c", 10, LEASE, 100) == []
    assert (await store.active_jobs())["job"].paused
    await rows.set_paused("job", False)
    [again] = await store.claim_due_runs("c", 10, LEASE, 100)
    assert (again.run_id, again.epoch) == (claimed_id, 2)


async def test_a_schedule_change_withdraws_the_old_schedules_runs_ahead(
    store: ReplicaStore, rows: Rows
) -> None:
    await store.sync_jobs([job()])
    past = await rows.insert("job", ago(30))
    ahead = await rows.insert("job", timedelta(minutes=10))
    claimed_ahead = await rows.insert("job", timedelta(seconds=30))
    manual = await rows.insert("job", timedelta(minutes=20), trigger="manual")
    claims = await store.claim_due_runs("c", 10, LEASE, 100, ahead=timedelta(minutes=1))
    assert {c.run_id for c in claims} == {past, claimed_ahead}
    assert await store.sync_jobs([job(cron="*/7 * * * *")]) == {"job": "changed"}
    assert await rows.row(ahead) is None
    assert await rows.row(claimed_ahead) is None
    assert (await _row(rows, past)).state is RunState.CLAIMED  # its instant has come
    assert (await _row(rows, manual)).state is RunState.PENDING  # an operator's
    state = (await store.active_jobs())["job"]
    assert state.materialized_until is not None
    assert abs(state.materialized_until - await store.database_now()) < timedelta(minutes=1)


async def test_a_removal_cancels_what_did_not_start_and_an_unchanged_sync_changes_nothing(
    store: ReplicaStore, rows: Rows
) -> None:
    assert await store.sync_jobs([job("gone"), job("kept")]) == {"gone": "added", "kept": "added"}
    version = await store.catalog_version()
    assert await store.sync_jobs([job("gone"), job("kept")]) == {}
    assert await store.catalog_version() == version
    pending = await rows.insert("gone", timedelta(minutes=1))
    claimed_id = await rows.insert("gone", ago(5))
    running_id = await rows.insert("gone", ago(10))
    claims = {c.run_id: c for c in await store.claim_due_runs("c", 10, LEASE, 100)}
    await store.start_runs("w", [message(claims[running_id])], LEASE)
    assert await store.sync_jobs([job("kept")]) == {"gone": "removed"}
    assert await store.catalog_version() != version
    assert set(await store.active_jobs()) == {"kept"}
    for run_id in (pending, claimed_id):
        row = await _row(rows, run_id)
        assert (row.state, row.error, row.lease_owner) == (
            RunState.CANCELLED,
            REMOVED_FROM_CONFIG,
            None,
        )
    assert (await _row(rows, running_id)).state is RunState.RUNNING
    _, [terminal] = await store.start_runs("w", [message(claims[claimed_id])], LEASE)
    assert terminal.reason is Why.TERMINAL


async def test_an_operators_queued_runs_of_a_forbid_job_run_one_after_another(
    store: ReplicaStore, rows: Rows
) -> None:
    """A backfill's runs (overlap queue, sql/0015) wait their turn; none is skipped.

    The job's own run due while one is active is still skipped (forbid), and
    an operator's run with overlap allow runs beside the active one.
    """
    await store.sync_jobs([job("single", overlap=Overlap.FORBID)])
    queued = [
        await rows.insert("single", ago(s), trigger="backfill", overlap=Overlap.QUEUE)
        for s in (40, 30, 20)
    ]
    order = []
    for turn, run_id in enumerate(queued):
        [claimed] = await store.claim_due_runs("c", 10, LEASE, 100)
        assert claimed.run_id == run_id  # the oldest waiting one, alone
        started, _ = await store.start_runs("w", [message(claimed)], LEASE)
        assert [s.run_id for s in started] == [run_id]
        if turn == 0:
            own = await rows.insert("single", ago(5))  # the job's own instant: forbid
            beside = await rows.insert("single", ago(4), trigger="manual", overlap=Overlap.ALLOW)
            assert dict(await store.skip_unrunnable(10)) == {own: SkipReason.OVERLAP_FORBIDDEN}
            [extra] = await store.claim_due_runs("c", 10, LEASE, 100)
            assert extra.run_id == beside  # allow: beside the active run
            await store.start_runs("w", [message(extra)], LEASE)
            done = Completion(beside, extra.epoch, ExecutionResult(Outcome.SUCCEEDED), None, "w")
            assert await store.complete_runs([done])
        assert await store.skip_unrunnable(10) == []  # the queued ones wait, never skipped
        assert await store.claim_due_runs("c", 10, LEASE, 100) == []  # one at a time
        for waiting in queued[turn + 1 :]:
            assert (await _row(rows, waiting)).state is RunState.PENDING
        ok = ExecutionResult(Outcome.SUCCEEDED)
        assert await store.complete_runs([Completion(run_id, claimed.epoch, ok, None, "w")])
        order.append(run_id)
    assert order == queued
    for run_id in queued:
        assert (await _row(rows, run_id)).state is RunState.SUCCEEDED

"""The operator's port on each store, through the service the CLI and the API share:
listing order and cursors, a run's attempts, trigger (never a future instant), pause and
resume, cancel, the action log."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from actors.adapters.postgres import PostgresOperatorStore, PostgresRunStore
from actors.domain import AttemptVerdict, ExecutionResult, Outcome, RunState
from actors.operator import BadInput, NotFound, NothingToDo, OperatorService, Unprocessable
from actors.ports import Caller, Completion, ReplicaStore
from actors.testing.memory import InMemoryRunStore
from actors.testing.memory_operator import InMemoryOperatorStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Rows

ALICE = Caller("alice", "cli", "laptop")


@pytest.fixture
def service(store: ReplicaStore) -> OperatorService:
    """The operator's service on the store's own operator adapter."""
    if isinstance(store, InMemoryRunStore):
        return OperatorService(InMemoryOperatorStore(store))
    return OperatorService(PostgresOperatorStore(cast(PostgresRunStore, store).pool))


async def test_runs_are_listed_newest_first_a_page_at_a_time(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job("a"), job("b")])
    inserted = [await rows.insert("a" if i % 2 else "b", ago(60 * (i + 1))) for i in range(5)]
    ahead = await rows.insert("a", timedelta(minutes=5))  # written ahead: not happened yet
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await service.runs(limit=2, cursor=cursor)
        seen += [r.id for r in page.runs]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == inserted  # newest first (each inserted further back), none twice
    assert pages == 3
    with_ahead = await service.runs(ahead=True, limit=10)
    assert [r.id for r in with_ahead.runs] == [ahead, *inserted]
    only_a = await service.runs(job="a", limit=10)
    assert [r.id for r in only_a.runs] == inserted[1::2]
    assert {r.job for r in only_a.runs} == {"a"}


async def test_the_job_list_counts_what_is_due_ahead_and_running(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job()])
    running = await rows.insert("job", ago(30))
    [claimed] = await store.claim_due_runs("c", 1, LEASE, 100)
    await store.start_runs("w", [message(claimed)], LEASE)
    await rows.insert("job", ago(20))
    await rows.insert("job", ago(10))
    await rows.insert("job", timedelta(minutes=5))
    [overview] = await service.jobs()
    assert (overview.name, overview.running, overview.backlog, overview.ahead) == (
        "job",
        1,
        2,
        1,
    )
    assert overview.last_outcome is None  # nothing finished yet
    detail = await service.run(running)
    assert detail.state == "running"
    assert [(a.outcome, a.worker) for a in detail.attempts] == [("running", "w")]


async def test_a_run_shows_every_attempt_with_its_verdict(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job(max_attempts=3)])
    run_id = await rows.insert("job", ago(30))
    [first] = await store.claim_due_runs("c", 1, LEASE, 100)
    await store.start_runs("w1", [message(first)], LEASE)
    failed = ExecutionResult(Outcome.FAILED, error="boom", exit_code=3)
    await store.complete_runs([Completion(run_id, first.epoch, failed, None, "w1")])
    detail = await service.run(run_id)
    assert (detail.state, detail.error) == ("failed", "boom")  # the job has no retry
    assert [
        (a.attempt, a.claim_epoch, a.worker, a.outcome, a.error, a.exit_code)
        for a in detail.attempts
    ] == [(1, first.epoch, "w1", "failed", "boom", 3)]
    assert detail.attempts[0].finished_at is not None
    with pytest.raises(NotFound):
        await service.run(rows.unknown_run())


async def test_each_attempt_keeps_its_own_output(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    """A retry does not overwrite what the attempt before it printed (sql/0014)."""
    await store.sync_jobs([job(max_attempts=2)])
    run_id = await rows.insert("job", ago(30))
    [first] = await store.claim_due_runs("c", 1, LEASE, 100)
    await store.start_runs("w1", [message(first)], LEASE)
    failed = ExecutionResult(Outcome.FAILED, error="boom", output_tail="first says hi\n")
    again = AttemptVerdict(RunState.PENDING, 2, timedelta(0))
    await store.complete_runs([Completion(run_id, first.epoch, failed, again, "w1")])
    [second] = await store.claim_due_runs("c", 1, LEASE, 100)
    await store.start_runs("w1", [message(second)], LEASE)
    succeeded = ExecutionResult(Outcome.SUCCEEDED, output_tail="second says hi\n")
    await store.complete_runs([Completion(run_id, second.epoch, succeeded, None, "w1")])
    detail = await service.run(run_id)
    assert [(a.attempt, a.output_tail) for a in detail.attempts] == [
        (1, "first says hi\n"),
        (2, "second says hi\n"),
    ]
    assert detail.output_tail == "second says hi\n"  # the run's: its latest attempt's


async def test_a_trigger_refuses_a_future_instant_and_adds_one_run_per_instant(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job()])
    now = await store.database_now()
    future = (now + timedelta(hours=1)).isoformat()
    with pytest.raises(Unprocessable, match="later than now"):
        await service.trigger(ALICE, "job", future)
    assert (await service.runs(ahead=True)).runs == []  # nothing written
    past = (now - timedelta(hours=1)).isoformat()
    done = await service.trigger(ALICE, "job", past)
    assert done["scheduled_instant"] is False  # the rare cron names no such instant
    row = await rows.row(done["run_id"])
    assert row is not None
    assert (row.state, row.scheduled_at) == (RunState.PENDING, now - timedelta(hours=1))
    with pytest.raises(NothingToDo, match="already has a run"):
        await service.trigger(ALICE, "job", past)
    with pytest.raises(NotFound):
        await service.trigger(ALICE, "nosuch", past)
    log = await service.actions(job="job")
    assert [(a["action"], a["ok"]) for a in log] == [
        ("trigger", False),
        ("trigger", True),
        ("trigger", False),
    ]
    assert log[1]["run_id"] == done["run_id"]
    assert log[1]["actor"] == "alice"
    assert log[1]["arguments"]["at"] == past


async def test_pause_and_resume_change_the_job_once_and_leave_the_paused_span(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job()])
    claimed_id = await rows.insert("job", ago(5))
    await store.claim_due_runs("c", 10, LEASE, 100)
    paused = await service.pause(ALICE, "job")
    assert paused["message"] == "paused job"
    assert (await service.jobs())[0].paused is True
    row = await rows.row(claimed_id)
    assert row is not None
    assert row.state is RunState.PENDING
    with pytest.raises(NothingToDo, match="already paused"):
        await service.pause(ALICE, "job")
    await rows.later()
    resumed = await service.resume(ALICE, "job")
    assert resumed["action_id"] > paused["action_id"]
    assert (await service.jobs())[0].paused is False
    with pytest.raises(NothingToDo, match="already running"):
        await service.resume(ALICE, "job")
    with pytest.raises(NotFound):
        await service.pause(ALICE, "nosuch")
    spans = await service.history.paused_spans("job")
    assert len(spans) == 1
    assert spans[0][1] is not None
    assert spans[0][0] <= spans[0][1]
    log = await service.actions(limit=2)
    assert [(a["action"], a["ok"]) for a in log] == [("pause", False), ("resume", False)]
    older = await service.actions(before=log[-1]["id"])
    assert [(a["action"], a["ok"]) for a in older] == [
        ("resume", True),
        ("pause", False),
        ("pause", True),
    ]


async def test_resume_skipping_the_paused_instants_skips_the_runs_due_meanwhile(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job()])
    before = await rows.insert("job", ago(3600))  # due before the pause: not a paused instant
    await service.pause(ALICE, "job")
    await rows.later()
    during = await rows.insert("job")  # came due while paused
    manual = await rows.insert("job", ago(-1), trigger="manual")  # an operator's own: runs
    with pytest.raises(BadInput, match="paused_instants must be run or skip"):
        await service.resume(ALICE, "job", "maybe")
    done = await service.resume(ALICE, "job", "skip")
    assert done["paused_instants"] == "skip"
    assert done["runs_skipped"] == 1
    assert "none runs" in done["message"]
    skipped = await rows.row(during)
    assert skipped is not None
    assert skipped.state is RunState.SKIPPED
    assert (skipped.error or "").startswith("paused")
    for left in (before, manual):
        row = await rows.row(left)
        assert row is not None
        assert row.state is RunState.PENDING
    assert (await service.jobs())[0].paused is False
    log = await service.actions(job="job", limit=1)
    assert (log[0]["action"], log[0]["ok"]) == ("resume", True)
    assert log[0]["arguments"] == {"paused_instants": "skip"}
    spans = await service.history.paused_spans_of(["job", "other"])
    assert list(spans) == ["job"]
    assert len(spans["job"]) == 1
    assert spans["job"][0][1] is not None
    grid = await service.grid(instants=3)
    assert [j["name"] for j in grid["jobs"]] == ["job"]


async def test_a_cancel_ends_a_pending_run_once(
    store: ReplicaStore, rows: Rows, service: OperatorService
) -> None:
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", ago(5))
    done = await service.cancel(ALICE, run_id)
    assert (done["job"], done["run_id"]) == ("job", run_id)
    row = await rows.row(run_id)
    assert row is not None
    assert (row.state, row.error) == (RunState.CANCELLED, "cancelled by alice")
    with pytest.raises(NothingToDo, match="is cancelled"):
        await service.cancel(ALICE, run_id)
    with pytest.raises(NotFound):
        await service.cancel(ALICE, rows.unknown_run())
    assert [(a["action"], a["ok"], a["run_id"]) for a in await service.actions()] == [
        ("cancel", False, None),
        ("cancel", False, run_id),
        ("cancel", True, run_id),
    ]

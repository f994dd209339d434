"""The store's row rules as one table: each case (a row's state, its times, its job's
policy -> the verdict) is judged by the pure predicate of actors/domain/row_rules.py and
by the store under test, through its port: the in-memory store (which calls the
predicate) and PostgreSQL (which runs the SQL fragment of the same name). A rule
changed in one place and not the other fails here, on the case that tells them apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from actors.domain import (
    Catchup,
    ExecutionResult,
    Outcome,
    Overlap,
    RunState,
    SkipReason,
    StartRefusal,
    refusal_of,
)
from actors.domain import row_rules as rules
from actors.ports import Completion, ReplicaStore
from tests.contract.jobs import LEASE, ago, job, message
from tests.contract.rows import Rows

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)  # the predicates' now; the stores use their own


@dataclass(frozen=True)
class Run:
    """A run as a case states it; times are seconds from now."""

    scheduled: float = -10.0
    due: float | None = None  # None: its instant
    state: RunState = RunState.PENDING
    trigger: str = "schedule"
    attempt: int = 1
    overlap: Overlap | None = None
    epoch: int = 0
    lease_owner: str | None = None
    lease: float | None = None  # seconds from now its lease ends

    @property
    def scheduled_at(self) -> datetime:
        return NOW + timedelta(seconds=self.scheduled)

    @property
    def due_at(self) -> datetime:
        return NOW + timedelta(seconds=self.scheduled if self.due is None else self.due)

    @property
    def lease_expires_at(self) -> datetime | None:
        return None if self.lease is None else NOW + timedelta(seconds=self.lease)


@dataclass(frozen=True)
class Job:
    overlap: Overlap = Overlap.ALLOW
    catchup: Catchup = Catchup.ALL
    deadline: float | None = None  # the starting deadline, seconds
    enabled: bool = True
    paused: bool = False

    @property
    def start_deadline(self) -> timedelta | None:
        return None if self.deadline is None else timedelta(seconds=self.deadline)


@dataclass(frozen=True)
class Case:
    name: str
    run: Run = field(default_factory=Run)
    job: Job = field(default_factory=Job)
    other: Run | None = None  # another run of the same job (a newer instant, the busy one)
    ahead: float = 0.0


async def arrange(store: ReplicaStore, rows: Rows, case: Case) -> str:
    """The case's job and rows in the store; the id of the run judged."""
    j = case.job
    await store.sync_jobs(
        [
            job(
                overlap=j.overlap,
                catchup=j.catchup,
                starting_deadline=j.start_deadline,
            )
        ]
    )
    if not j.enabled:
        await store.sync_jobs([job("another")])  # removed from the config
    run_id = await _insert(rows, case.run)
    if case.other is not None:
        other = await _insert(rows, case.other)
        if case.other.state is not RunState.PENDING:
            await rows.force(other, case.other.state)
    if j.paused:
        await rows.pause_unseen("job")
    return run_id


async def _insert(rows: Rows, run: Run) -> str:
    due = None if run.due is None else timedelta(seconds=run.due)
    return await rows.insert(
        "job",
        timedelta(seconds=run.scheduled),
        due,
        trigger=run.trigger,
        overlap=run.overlap,
        attempt=run.attempt,
    )


# --- MUST_NOT_RUN: the claim records skipped what must not run ----------------------

LATEST = Job(catchup=Catchup.LATEST)
NEWER = Run(scheduled=-5)
MUST_NOT_RUN = [
    Case("past its deadline", Run(scheduled=-60), Job(deadline=30)),
    Case("within its deadline", Run(scheduled=-10), Job(deadline=30)),
    Case("a retry has no deadline", Run(scheduled=-60, attempt=2), Job(deadline=30)),
    Case("a trigger has no deadline", Run(scheduled=-60, trigger="manual"), Job(deadline=30)),
    Case("a backfill has no deadline", Run(scheduled=-60, trigger="backfill"), Job(deadline=30)),
    Case("no deadline", Run(scheduled=-60)),
    Case("latest: a newer instant due", Run(scheduled=-60), LATEST, NEWER),
    Case("latest: a newer instant not yet due", Run(-60), LATEST, Run(scheduled=-5, due=30)),
    Case("latest: a newer instant in the future", Run(scheduled=-60), LATEST, Run(scheduled=30)),
    *(
        Case(f"latest: a newer instant {s}", Run(-60), LATEST, replace(NEWER, state=s))
        for s in RunState
        if s is not RunState.PENDING
    ),
    Case("latest: a newer trigger", Run(-60), LATEST, replace(NEWER, trigger="manual")),
    Case("latest: a trigger is never superseded", Run(-60, trigger="manual"), LATEST, NEWER),
    Case("catchup all: a newer instant due", Run(scheduled=-60), Job(), NEWER),
    Case("deadline before latest", Run(-60), Job(catchup=Catchup.LATEST, deadline=30), NEWER),
]


@pytest.mark.parametrize("case", MUST_NOT_RUN, ids=lambda c: c.name)
async def test_must_not_run(store: ReplicaStore, rows: Rows, case: Case) -> None:
    others = [case.other] if case.other else []
    expected = rules.must_not_run(case.run, case.job, others, NOW)
    run_id = await arrange(store, rows, case)
    claimed = {c.run_id for c in await store.claim_due_runs("c", 10, LEASE, 100)}
    row = await rows.row(run_id)
    assert row is not None
    if expected is None:
        assert run_id in claimed
        assert row.state is RunState.CLAIMED
    else:
        assert run_id not in claimed
        assert (row.state, row.error, row.epoch) == (RunState.SKIPPED, expected, 0)


# --- which claim takes a run: JOB_OPEN, CLAIMABLE, RUNS_BESIDE_OTHERS, JOB_BUSY -------

BUSY = Run(scheduled=-30, state=RunState.RUNNING)
CLAIMS = [
    Case("allow", Run()),
    Case("allow, busy", Run(), Job(), BUSY),
    Case("forbid", Run(), Job(overlap=Overlap.FORBID)),
    Case("forbid, busy", Run(), Job(overlap=Overlap.FORBID), BUSY),
    Case("queue, busy", Run(), Job(overlap=Overlap.QUEUE), BUSY),
    Case("forbid, its run allow, busy", Run(overlap=Overlap.ALLOW), Job(Overlap.FORBID), BUSY),
    Case("queue, a run queued", Run(overlap=Overlap.QUEUE), Job(overlap=Overlap.QUEUE)),
    Case("allow, a run queued, busy", Run(overlap=Overlap.QUEUE), Job(), BUSY),
    Case("paused", Run(), Job(paused=True)),
    Case("removed", Run(), Job(enabled=False)),
    Case("not yet due", Run(scheduled=10)),
    Case("due within claim_ahead", Run(scheduled=10), ahead=30),
    Case("its instant come, not yet due", Run(scheduled=-10, due=10)),
    Case("claimed already", Run(state=RunState.CLAIMED)),
]


@pytest.mark.parametrize("case", CLAIMS, ids=lambda c: c.name)
async def test_which_runs_a_claim_takes(store: ReplicaStore, rows: Rows, case: Case) -> None:
    by = NOW + timedelta(seconds=case.ahead)
    busy = rules.job_busy([case.other] if case.other else [])
    expected = (
        rules.job_open(case.job)
        and rules.claimable(case.run, by)
        and (rules.runs_beside_others(case.job, case.run) or not busy)
    )
    run_id = await arrange(store, rows, case)
    if case.run.state is not RunState.PENDING:
        await rows.force(run_id, case.run.state)
    ahead = timedelta(seconds=case.ahead)
    claimed = {c.run_id for c in await store.claim_due_runs("c", 10, LEASE, 100, ahead=ahead)}
    assert (run_id in claimed) is expected


# --- OVERLAP_FORBIDDEN: the skip pass ----------------------------------------------

FORBID = Job(overlap=Overlap.FORBID)
SKIPS = [
    Case("forbid, busy", Run(), FORBID, BUSY),
    Case("forbid, not busy", Run(), FORBID),
    Case("forbid, busy, the run's own forbid", Run(overlap=Overlap.FORBID), FORBID, BUSY),
    Case("forbid, busy, a run queued", Run(overlap=Overlap.QUEUE), FORBID, BUSY),
    Case("forbid, busy, a run of its own allow", Run(overlap=Overlap.ALLOW), FORBID, BUSY),
    Case("forbid, busy by a claim", Run(), FORBID, replace(BUSY, state=RunState.CLAIMED)),
    Case("forbid, the other finished", Run(), FORBID, replace(BUSY, state=RunState.SUCCEEDED)),
    Case("queue, busy", Run(), Job(overlap=Overlap.QUEUE), BUSY),
    Case("allow, busy", Run(), Job(), BUSY),
    Case("forbid, busy, not yet due", Run(scheduled=-10, due=10), FORBID, BUSY),
    Case("forbid, busy, in the future", Run(scheduled=10), FORBID, BUSY),
    Case("forbid, busy, paused", Run(), replace(FORBID, paused=True), BUSY),
]


@pytest.mark.parametrize("case", SKIPS, ids=lambda c: c.name)
async def test_overlap_forbidden(store: ReplicaStore, rows: Rows, case: Case) -> None:
    busy = rules.job_busy([case.other] if case.other else [])
    expected = rules.job_open(case.job) and rules.overlap_forbidden(case.run, case.job, busy, NOW)
    run_id = await arrange(store, rows, case)
    skipped = dict(await store.skip_unrunnable(10))
    assert skipped.get(run_id) == (SkipReason.OVERLAP_FORBIDDEN if expected else None)


# --- LEASE_EXPIRED: what the reaper takes -----------------------------------------

LEASES = [
    Case("claimed, lease over", Run(state=RunState.CLAIMED, lease=-1)),
    Case("running, lease over", Run(state=RunState.RUNNING, lease=-1)),
    Case("claimed, lease on", Run(state=RunState.CLAIMED, lease=60)),
    Case("running, lease on", Run(state=RunState.RUNNING, lease=60)),
    Case("pending", Run()),
]


@pytest.mark.parametrize("case", LEASES, ids=lambda c: c.name)
async def test_lease_expired(store: ReplicaStore, rows: Rows, case: Case) -> None:
    expected = rules.lease_expired(case.run, NOW)
    run_id = await arrange(store, rows, case)
    if case.run.lease is not None:
        await rows.force(run_id, case.run.state, lease=timedelta(seconds=case.run.lease))
    reaped = {r[0] for r in await store.reap_expired_leases(10)}
    assert (run_id in reaped) is expected


# --- the fences: HELD_CLAIMED, HELD_RUNNING, COMPLETION_ACCEPTED -------------------
#
# The run is claimed by "c" under epoch 1 and (when running) started by "w"; each case
# is an action by ``who`` under ``epoch``.


@dataclass(frozen=True)
class Fence:
    action: str  # release | heartbeat | complete
    state: RunState
    who: str
    epoch: int = 1


FENCES = [
    Fence("release", RunState.CLAIMED, "c"),
    Fence("release", RunState.CLAIMED, "x"),
    Fence("release", RunState.CLAIMED, "c", epoch=0),
    Fence("release", RunState.RUNNING, "w"),
    Fence("heartbeat", RunState.RUNNING, "w"),
    Fence("heartbeat", RunState.RUNNING, "x"),
    Fence("heartbeat", RunState.RUNNING, "w", epoch=0),
    Fence("heartbeat", RunState.CLAIMED, "c"),
    Fence("complete", RunState.RUNNING, "w"),
    Fence("complete", RunState.RUNNING, "x"),  # the owner is not judged
    Fence("complete", RunState.RUNNING, "w", epoch=0),
    Fence("complete", RunState.CLAIMED, "c"),
]


def _fence_id(f: Fence) -> str:
    return f"{f.action} of a {f.state} run by {f.who} under epoch {f.epoch}"


@pytest.mark.parametrize("fence", FENCES, ids=_fence_id)
async def test_fences(store: ReplicaStore, rows: Rows, fence: Fence) -> None:
    owner = "w" if fence.state is RunState.RUNNING else "c"
    held = Run(state=fence.state, epoch=1, lease_owner=owner)
    expected = {
        "release": rules.held_claimed(held, fence.who, fence.epoch),
        "heartbeat": rules.held_running(held, fence.who, fence.epoch),
        "complete": rules.completion_accepted(held, fence.epoch),
    }[fence.action]
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", ago(10))
    [claim] = await store.claim_due_runs("c", 10, LEASE, 100)
    if fence.state is RunState.RUNNING:
        started, _ = await store.start_runs("w", [message(claim)], LEASE)
        assert [s.run_id for s in started] == [run_id]
    if fence.action == "release":
        done = await store.release_unpublished(fence.who, [replace(claim, epoch=fence.epoch)])
        assert (done == 1) is expected
    elif fence.action == "heartbeat":
        extended = await store.extend_leases(fence.who, [(run_id, fence.epoch)], LEASE)
        assert bool(extended) is expected
    else:
        ok = ExecutionResult(Outcome.SUCCEEDED)
        recorded = await store.complete_runs([Completion(run_id, fence.epoch, ok, None, fence.who)])
        assert bool(recorded) is expected
    row = await rows.row(run_id)
    assert row is not None
    changed = {
        "release": RunState.PENDING,
        "heartbeat": fence.state,
        "complete": RunState.SUCCEEDED,
    }[fence.action]
    assert row.state is (changed if expected else fence.state)


# --- STARTABLE, DUE_TO_START: what a start starts --------------------------------
#
# The run is claimed by "c" under epoch 1 (ahead when it is not yet due) and, for a
# running one, started by ``runner``; then "w" delivers it under ``epoch``.


@dataclass(frozen=True)
class Start:
    name: str
    state: RunState = RunState.CLAIMED
    runner: str = "w"  # who started it, when running
    epoch: int = 1
    retake: bool = False
    due: float = -10.0
    paused: bool = False


RUNNING = RunState.RUNNING
STARTS = [
    Start("claimed"),
    Start("claimed, an older epoch's message", epoch=0),
    Start("claimed, not yet due", due=30),
    Start("claimed, its job paused", paused=True),
    Start("running here", RUNNING),
    Start("running here, retaken", RUNNING, retake=True),
    Start("running here, retaken under an older epoch", RUNNING, retake=True, epoch=0),
    Start("running elsewhere, retaken", RUNNING, runner="x", retake=True),
    Start("running here, paused, retaken", RUNNING, retake=True, paused=True),
]


@pytest.mark.parametrize("case", STARTS, ids=lambda c: c.name)
async def test_startable(store: ReplicaStore, rows: Rows, case: Start) -> None:
    owner = case.runner if case.state is RunState.RUNNING else "c"
    held = Run(scheduled=case.due, state=case.state, epoch=1, lease_owner=owner, lease=300)
    if not rules.startable(held, "w", case.epoch, case.retake):
        expected = refusal_of(held.state, held.epoch, case.epoch)
    elif held.state is RunState.CLAIMED and case.paused:
        expected = StartRefusal.STALE  # handed back to pending
    elif not rules.due_to_start(held, NOW):
        expected = StartRefusal.EARLY
    else:
        expected = None  # started
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", timedelta(seconds=case.due))
    ahead = timedelta(seconds=max(0.0, case.due) + 30)
    [claim] = await store.claim_due_runs("c", 10, LEASE, 100, ahead=ahead)
    if case.state is RunState.RUNNING:
        started, _ = await store.start_runs(case.runner, [message(claim)], LEASE)
        assert [s.run_id for s in started] == [run_id]
    if case.paused:
        await rows.pause_unseen("job")
    delivery = message(replace(claim, epoch=case.epoch))
    retake = {(run_id, case.epoch)} if case.retake else set()
    started, refused = await store.start_runs("w", [delivery], LEASE, retake=retake)
    if expected is None:
        assert [s.run_id for s in started] == [run_id]
    else:
        assert started == []
        assert [r.reason for r in refused] == [expected]


# --- PRUNABLE: what retention deletes ----------------------------------------------


@pytest.mark.parametrize(
    ("state", "finished_ago", "expected"),
    [
        *((s, 7200, True) for s in RunState if s.terminal),
        (RunState.SUCCEEDED, 1800, False),
        (RunState.PENDING, 7200, False),
        (RunState.RUNNING, 7200, False),
    ],
    ids=str,
)
async def test_prunable(
    store: ReplicaStore, rows: Rows, state: RunState, finished_ago: int, expected: bool
) -> None:
    ago_ = timedelta(seconds=finished_ago)
    finished_at = NOW - ago_ if state.terminal else None
    assert rules.prunable(state, finished_at, NOW, timedelta(hours=1)) is expected
    await store.sync_jobs([job()])
    run_id = await rows.insert("job", ago(10))
    if state is not RunState.PENDING:
        await rows.force(run_id, state, finished=ago_)
    pruned = await store.prune_history(timedelta(hours=1), 10)
    assert pruned == int(expected)
    assert (await rows.row(run_id) is None) is expected

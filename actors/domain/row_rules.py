"""The store's rules on one row: what may be claimed, what must not run, what the reaper
takes, what a fence accepts.

Each rule is a pure predicate here and a SQL fragment of the same name (in capitals)
in ``actors/adapters/postgres/statements/row_rules.py``, spliced into the statements
that judge it. The in-memory store calls the predicates; the PostgreSQL store runs
the fragments; ``tests/contract/test_row_rules.py`` holds both to one table of
cases (a row's state, its times, its job's policy -> the verdict). A change of a
rule is a change of both, in one commit, and a row of that table.

The predicates read a row through the small protocols below (any object with those
attributes: the in-memory store's rows, a test's case), and judge it on ``now``,
the store's clock (the database's ``now()`` in the fragments).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Protocol

from actors.domain.jobs import Catchup, Overlap
from actors.domain.refusals import SkipReason
from actors.domain.runs import RunState


class RunFacts(Protocol):
    """What the rules read of a ``job_runs`` row."""

    @property
    def state(self) -> RunState: ...
    @property
    def trigger(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def scheduled_at(self) -> datetime: ...
    @property
    def due_at(self) -> datetime: ...
    @property
    def overlap(self) -> Overlap | None: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def lease_expires_at(self) -> datetime | None: ...


class JobFacts(Protocol):
    """What the rules read of a ``jobs`` row."""

    @property
    def enabled(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def overlap(self) -> Overlap: ...
    @property
    def catchup(self) -> Catchup: ...
    @property
    def start_deadline(self) -> timedelta | None: ...


# The states of a run that holds a lease (claimed or running): the reaper's and the
# exclusive claim's "active".
LEASED = frozenset({RunState.CLAIMED, RunState.RUNNING})
# The states in which a newer instant has moved on (with a pending one that is due).
_MOVED_ON = frozenset({RunState.CLAIMED, RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED})


def job_open(job: JobFacts) -> bool:
    """JOB_OPEN: the job's runs may be claimed (in the config and not paused)."""
    return job.enabled and not job.paused


def claimable(run: RunFacts, by: datetime) -> bool:
    """CLAIMABLE: pending and due by ``by`` (now, or now + claim_ahead)."""
    return run.state is RunState.PENDING and run.due_at <= by


def runs_beside_others(job: JobFacts, run: RunFacts) -> bool:
    """RUNS_BESIDE_OTHERS: which claim takes the run. With overlap = allow (the job's, or
    the run's own, sql/0015) any number run at once; every other run is the exclusive
    claim's, one per job at a time and only while none of the job's runs is leased."""
    return Overlap.ALLOW in (job.overlap, run.overlap)


def job_busy(job_runs: Iterable[RunFacts]) -> bool:
    """JOB_BUSY: one of the job's runs holds a lease (claimed or running)."""
    return any(r.state in LEASED for r in job_runs)


def moved_on(newer: RunFacts, now: datetime) -> bool:
    """MOVED_ON: a newer instant counts against an older one (catchup = latest) once it
    is claimed, running or finished with an attempt, or pending and due."""
    return newer.state in _MOVED_ON or (newer.state is RunState.PENDING and newer.due_at <= now)


def deadline_missed(run: RunFacts, job: JobFacts, now: datetime) -> bool:
    """DEADLINE_MISSED: a first attempt of a scheduled run not started by its instant +
    the job's starting deadline. A retry is the same instant trying again; a trigger or
    a backfill is an operator asking for a (past) instant to run now."""
    return (
        run.trigger == "schedule"
        and run.attempt == 1
        and job.start_deadline is not None
        and run.scheduled_at < now - job.start_deadline
    )


def superseded(run: RunFacts, job: JobFacts, job_runs: Iterable[RunFacts], now: datetime) -> bool:
    """SUPERSEDED: with catchup = latest, a scheduled run once a newer scheduled instant of
    the job, not in the future, has moved on (``job_runs``: the job's other runs)."""
    if job.catchup is not Catchup.LATEST or run.trigger != "schedule":
        return False
    return any(
        n.trigger == "schedule" and run.scheduled_at < n.scheduled_at <= now and moved_on(n, now)
        for n in job_runs
    )


def must_not_run(
    run: RunFacts, job: JobFacts, job_runs: Iterable[RunFacts], now: datetime
) -> SkipReason | None:
    """MUST_NOT_RUN: why a due run must not run, or None; judged by the claims, the start
    and the skip pass, always on the row as it is now."""
    if deadline_missed(run, job, now):
        return SkipReason.DEADLINE_MISSED
    if superseded(run, job, job_runs, now):
        return SkipReason.SUPERSEDED
    return None


def overlap_forbidden(run: RunFacts, job: JobFacts, busy: bool, now: datetime) -> bool:
    """OVERLAP_FORBIDDEN: with overlap = forbid, a pending run whose instant has come while
    another run of the job is leased (``busy``). A run with its own overlap (queue, an
    operator's backfill; allow) waits its turn instead (sql/0015)."""
    return (
        job.overlap is Overlap.FORBID
        and busy
        and run.state is RunState.PENDING
        and run.scheduled_at <= now
        and run.due_at <= now
        and run.overlap in (None, Overlap.FORBID)
    )


def lease_expired(run: RunFacts, now: datetime) -> bool:
    """LEASE_EXPIRED: what the reaper takes, a leased run whose lease ran out."""
    return run.state in LEASED and run.lease_expires_at is not None and run.lease_expires_at < now


def held_claimed(run: RunFacts, owner: str, epoch: int) -> bool:
    """HELD_CLAIMED: the fence of a release, this owner's claim under this epoch, not
    started."""
    return run.state is RunState.CLAIMED and run.epoch == epoch and run.lease_owner == owner


def held_running(run: RunFacts, owner: str, epoch: int) -> bool:
    """HELD_RUNNING: the fence of a heartbeat and of an interruption, this worker's
    execution under this epoch."""
    return run.state is RunState.RUNNING and run.epoch == epoch and run.lease_owner == owner


def startable(run: RunFacts, worker: str, epoch: int, retake: bool) -> bool:
    """STARTABLE: a delivery under ``epoch`` may start the run: claimed under that epoch,
    or running under it already by this worker, which says (``retake``) that the start's
    reply never reached it. Anything else changes nothing (``refusal_of`` says why)."""
    if run.epoch != epoch:
        return False
    return run.state is RunState.CLAIMED or (retake and held_running(run, worker, epoch))


def due_to_start(run: RunFacts, now: datetime) -> bool:
    """DUE_TO_START: a claimed run starts no sooner than it is due on the store's clock (a
    run claimed ahead, whose worker's estimate ran fast, is held a little longer)."""
    return run.state is not RunState.CLAIMED or run.due_at <= now


def completion_accepted(run: RunFacts, epoch: int) -> bool:
    """COMPLETION_ACCEPTED: the fence of a completion, the run still running under the
    epoch its worker started it with. The owner is not judged: a worker restarted under
    a new id still records the runs it executed, unless the lease was reaped (the epoch
    moved on)."""
    return run.state is RunState.RUNNING and run.epoch == epoch


def prunable(
    state: RunState, finished_at: datetime | None, now: datetime, older_than: timedelta
) -> bool:
    """PRUNABLE: history old enough to delete, a finished run finished before now -
    ``older_than``."""
    return state.terminal and finished_at is not None and finished_at < now - older_than

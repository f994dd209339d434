"""The rows of the in-memory store, and the one policy rule they share (MUST_NOT_RUN)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain import Catchup, Outcome, Overlap, RunState

DEADLINE_MISSED = "missed its starting deadline"
SUPERSEDED = "superseded by a later instant (catchup = latest)"
OVERLAP_FORBIDDEN = "overlap forbidden: an earlier run was still active"


@dataclass
class JobRow:
    """One row of ``jobs``."""

    id: int
    name: str
    definition: str  # JSON text, as stored (actors.domain.encode_job)
    fingerprint: str
    enabled: bool
    max_attempts: int
    overlap: Overlap
    catchup: Catchup
    start_deadline: timedelta | None
    paused: bool = False
    materialized_until: datetime | None = None
    created_at: datetime | None = None
    history_pruned_through: datetime | None = None


@dataclass
class RunRow:
    """One row of ``job_runs``: a job's run at one instant, forever."""

    id: str
    job: str  # the job's name (the real table joins on job_id)
    scheduled_at: datetime
    due_at: datetime
    state: RunState = RunState.PENDING
    attempt: int = 1
    epoch: int = 0
    trigger: str = "schedule"  # schedule | manual | backfill
    exclusive: bool = False
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None
    exit_code: int | None = None
    error: str | None = None
    output_tail: str | None = None

    def held(self, owner: str, epoch: int, state: RunState) -> bool:
        """The guard of every change after a claim: this owner, this epoch, this state."""
        return self.state is state and self.epoch == epoch and self.lease_owner == owner

    def finish(self, state: RunState, now: datetime, reason: str) -> None:
        """Skipped or cancelled without an attempt (the epoch stays: never claimed)."""
        self.state = state
        self.outcome = state.value
        self.error = reason
        self.finished_at = now
        self.lease_owner = self.lease_expires_at = self.claimed_at = None


@dataclass(frozen=True)
class AttemptRow:
    """One row of ``job_run_attempts``: an attempt that ended (or was lost)."""

    run_id: str
    attempt: int
    epoch: int
    worker: str
    started_at: datetime | None
    outcome: Outcome
    error: str | None
    exit_code: int | None = None


def must_not_run(run: RunRow, job: JobRow, runs: Iterable[RunRow], now: datetime) -> str | None:
    """Why a due run must not run, or None (MUST_NOT_RUN, on the row as it is now).

    A first scheduled attempt past its starting deadline; or, with catchup =
    latest, a scheduled run once a newer scheduled instant of the job is due
    or has moved on (claimed, running, finished).
    """
    if (
        run.trigger == "schedule"
        and run.attempt == 1
        and job.start_deadline is not None
        and run.scheduled_at < now - job.start_deadline
    ):
        return DEADLINE_MISSED
    if job.catchup is Catchup.LATEST and run.trigger == "schedule":
        moved_on = (RunState.CLAIMED, RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED)
        for n in runs:
            if (
                n.job == run.job
                and n.trigger == "schedule"
                and run.scheduled_at < n.scheduled_at <= now
                and (n.state in moved_on or (n.state is RunState.PENDING and n.due_at <= now))
            ):
                return SUPERSEDED
    return None

"""The rows of the in-memory store, and how a verdict moves a row (the rules that judge
them are actors.domain.row_rules, the SQL's own)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain import AttemptVerdict, Catchup, Outcome, Overlap, RunState, SkipReason

# The words of actors.domain.SkipReason, under the names the unit tests import.
DEADLINE_MISSED = SkipReason.DEADLINE_MISSED
SUPERSEDED = SkipReason.SUPERSEDED
OVERLAP_FORBIDDEN = SkipReason.OVERLAP_FORBIDDEN


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
    planned_since: datetime | None = None  # where a withdrawn plan started again


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
    overlap: Overlap | None = None  # the run's own overlap mode (sql/0015); None: the job's
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None
    exit_code: int | None = None
    error: str | None = None
    output_tail: str | None = None

    def hand_back(self) -> None:
        """Pending again, as if never claimed: the epoch stays, so its message is stale."""
        self.state = RunState.PENDING
        self.lease_owner = self.lease_expires_at = self.claimed_at = None

    def apply(self, verdict: AttemptVerdict, now: datetime) -> None:
        """Where the verdict sends the run: next state, attempt and due time; the lease ends."""
        self.state = verdict.state
        if verdict.attempt is not None:
            self.attempt = verdict.attempt
        if verdict.due_in is not None:
            self.due_at = now + verdict.due_in
        self.finished_at = None if verdict.retry else now
        if verdict.retry:
            self.started_at = None
        self.lease_owner = self.lease_expires_at = self.claimed_at = None

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
    finished_at: datetime | None = None
    output_tail: str | None = None

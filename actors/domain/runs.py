"""Runs: one due instant of one job, and the states it moves through."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain.errors import IllegalTransition


class RunState(enum.StrEnum):
    """The life of a run. Every change is one guarded UPDATE in the store."""

    PENDING = "pending"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.SKIPPED, RunState.CANCELLED}
)
# The error of a run cancelled because its job left the config file (by the
# sync, or by the reaper for one that came back to pending). A re-add of the
# job finds by it the rows of instants still ahead to plan again; an operator's
# cancel says who cancelled, so it is never taken back.
REMOVED_FROM_CONFIG = "job removed from config"

ALLOWED_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.CLAIMED, RunState.SKIPPED, RunState.CANCELLED}),
    # claimed -> pending: publish failed (compensator) or lease expired (reaper)
    RunState.CLAIMED: frozenset(
        {RunState.RUNNING, RunState.PENDING, RunState.SKIPPED, RunState.CANCELLED}
    ),
    # running -> pending: a retry, or the reaper after a lost worker
    RunState.RUNNING: frozenset(
        {RunState.SUCCEEDED, RunState.FAILED, RunState.PENDING, RunState.CANCELLED}
    ),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.SKIPPED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


def check_transition(current: RunState, target: RunState) -> None:
    """Raise IllegalTransition unless the state machine allows ``current -> target``."""
    if target not in ALLOWED_TRANSITIONS[current]:
        raise IllegalTransition(f"a run cannot go from {current} to {target}")


class Outcome(enum.StrEnum):
    """What one execution attempt ended with."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    # Recorded by the store, not the executor: the worker was lost (the reaper
    # found its lease expired), or stopped before the run finished (shutdown).
    LEASE_EXPIRED = "lease_expired"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class ClaimedRun:
    """A run this replica holds a lease on, on its way to the broker."""

    run_id: str
    job: str
    scheduled_at: datetime
    attempt: int
    epoch: int
    # When it is due (its instant plus jitter, or a retry's time): a run claimed
    # ahead is held by its worker until then. None: start it at once.
    due_at: datetime | None = None
    # The kind of work, as the claim saw the job ("python:<target>", "shell",
    # "http"): whether a worker runs it on its event loop or in a slot.
    executor: str | None = None


@dataclass(frozen=True)
class RunContext:
    """What every execution is told about its run.

    ``run_id`` is the idempotency key: stable across attempts and deliveries,
    so the work itself can dedupe. ``fencing_token`` is the claim epoch: it
    grows every time the run is claimed again, so a downstream system can
    refuse writes from an older holder.
    """

    run_id: str
    job: str
    scheduled_at: datetime
    attempt: int
    fencing_token: int
    # The W3C trace context of this execution ("traceparent", "tracestate"),
    # when tracing is on: a job's own spans are children of claimd's.
    trace_context: tuple[tuple[str, str], ...] = ()

    def trace_headers(self) -> dict[str, str]:
        """The trace context as a carrier for opentelemetry's ``propagate.extract``."""
        return dict(self.trace_context)

    def env(self) -> dict[str, str]:
        """The environment a shell execution receives."""
        env = {
            "CLAIMD_RUN_ID": self.run_id,
            "CLAIMD_JOB": self.job,
            "CLAIMD_SCHEDULED_AT": self.scheduled_at.isoformat(),
            "CLAIMD_ATTEMPT": str(self.attempt),
            "CLAIMD_FENCING_TOKEN": str(self.fencing_token),
        }
        for name, value in self.trace_context:
            env[name.upper()] = value  # TRACEPARENT, TRACESTATE
        return env

    def headers(self) -> dict[str, str]:
        """The headers an HTTP execution sends."""
        return {
            "Idempotency-Key": self.run_id,
            "Claimd-Job": self.job,
            "Claimd-Scheduled-At": self.scheduled_at.isoformat(),
            "Claimd-Attempt": str(self.attempt),
            "Claimd-Fencing-Token": str(self.fencing_token),
            **dict(self.trace_context),
        }

    def template_values(self) -> dict[str, str]:
        """Values a command or body may name in braces, e.g. ``{scheduled_date}``."""
        return {
            "run_id": self.run_id,
            "job": self.job,
            "scheduled_at": self.scheduled_at.isoformat(),
            "scheduled_date": self.scheduled_at.date().isoformat(),
            "attempt": str(self.attempt),
            "fencing_token": str(self.fencing_token),
        }


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one attempt, with what an operator needs to see."""

    outcome: Outcome
    exit_code: int | None = None
    error: str | None = None
    output_tail: str | None = None
    duration: timedelta = timedelta(0)

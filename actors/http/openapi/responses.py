"""What the server answers: every response body as a pydantic model (the operator's
read models are actors.operator.models, imported here).

The handlers send each answer through its model (an answer with a key the
model does not name is a bug, not a response), and the document's schemas are
these models' JSON schemas. Every key is always present; ``X | None`` is a
key whose value may be null.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, RootModel

from actors.domain import RunState
from actors.domain.history import Status
from actors.operator.models import (
    Answer,
    Attempt,
    Audit,
    AuditEntry,
    AuditRun,
    AuditSummary,
    ConfigGeneration,
    ConfigReplica,
    ConfigRollout,
    Counters,
    Job,
    JobDetail,
    JobRejection,
    LastOutcome,
    LocalTime,
    RejectedJob,
    ReplicaStatus,
    Run,
    RunDetail,
    RunsPage,
    TriggerName,
    UtcTime,
    Uuid,
)

# The operator's read models (actors.operator.models) are the answers of its reads;
# the rest are declared here.
__all__ = [
    "Attempt",
    "Audit",
    "AuditEntry",
    "AuditRun",
    "AuditSummary",
    "ConfigGeneration",
    "ConfigReplica",
    "ConfigRollout",
    "Counters",
    "Job",
    "JobDetail",
    "JobRejection",
    "LastOutcome",
    "RejectedJob",
    "ReplicaStatus",
    "Run",
    "RunDetail",
    "RunsPage",
]


_Answer = Answer


class Error(_Answer):
    error: str = Field(description="what is wrong, naming the field or value")


class Jobs(RootModel[list[Job]]):
    pass


class Action(_Answer):
    id: int
    at: UtcTime
    actor: str
    via: Literal["cli", "http", "signal"]
    origin: str | None
    action: Literal["pause", "resume", "trigger", "cancel", "backfill", "reload"]
    job: str | None
    run_id: Uuid | None
    arguments: dict[str, Any]
    ok: bool
    result: str


class Actions(RootModel[list[Action]]):
    pass


class GridCell(_Answer):
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    status: Status = Field(description="as `claimd audit` judges the instant")
    problem: bool
    reason: str | None
    run_id: Uuid | None
    state: RunState | None
    attempt: int | None
    trigger: TriggerName | None = Field(
        description="who made the run: the schedule, or an operator (manual, backfill)"
    )


class GridJob(_Answer):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    timezone: str
    schedule_words: str = Field(
        description="the schedule in words, e.g. 'every day at 02:00' (the zone apart)"
    )
    start: UtcTime = Field(alias="from")
    cells: list[GridCell]


class Grid(_Answer):
    now: UtcTime
    instants: int
    jobs: list[GridJob]


class ActionResult(_Answer):
    """Pause, resume and cancel: done and recorded."""

    action: Literal["pause", "resume", "trigger", "cancel", "backfill"]
    job: str | None
    run_id: Uuid | None
    message: str
    action_id: int
    at: UtcTime
    actor: str = Field(description="the name of the token presented")


class ResumeResult(ActionResult):
    """A resume: what became of the instants that came due while the job was paused."""

    paused_instants: Literal["run", "skip"]
    paused_at: UtcTime | None = Field(description="when the pause began (null: not recorded)")
    runs_skipped: int | None = Field(description="skip: runs written ahead, now skipped")
    instants_gapped: int | None = Field(description="skip: instants recorded as a gap")
    runs_due_now: int | None = Field(description="run: runs due now, which start now")
    instants_unwritten: int | None = Field(
        description="run: instants not yet written, planned as the catch-up policy says"
    )


class TriggerResult(ActionResult):
    run_id: Uuid
    scheduled_at: UtcTime
    scheduled_instant: bool = Field(description="whether the job's schedule names the instant")
    overlap: Literal["queue", "allow", "forbid"] = Field(
        description="the run's own overlap mode, as written on it"
    )
    waits_for: Uuid | None = Field(
        None,
        description="overlap queue: the job's run claimed or running when this one was "
        "added, which it waits for (null: none)",
    )


class BackfillResult(ActionResult):
    added: int
    existing: int
    instants: int
    overlap: Literal["queue", "allow", "forbid"] = Field(
        description="the runs' own overlap mode, as written on each"
    )


# --- the replica's own routes ----------------------------------------------------------


class Health(_Answer):
    status: Literal["ok"]


class Ready(_Answer):
    status: Literal["ok", "degraded", "unavailable"]
    checks: dict[str, str] = Field(description="each server: 'ok', or what is wrong")


class RejectedJobs(RootModel[list[RejectedJob]]):
    pass


class Document(RootModel[dict[str, Any]]):
    """The OpenAPI 3.1 document."""


class Metrics(RootModel[str]):
    """The Prometheus text exposition."""


class OutputStream(_Answer):
    """One Server-Sent Event of a run's output stream (OpenAPI 3.1: the schema is each event's)."""

    event: Literal["output", "notice", "end"] = Field(
        description="output: text the run printed, in order; notice: what the stream "
        "missed or why it closes; end: the run is terminal, the stream closes"
    )
    data: str = Field(
        description='one JSON object: output {"attempt": n, "text": "..."}; notice '
        '{"text": "..."}; end {"state": "...", "outcome": "..."}'
    )

"""What the server answers: every response body as a pydantic model (the operator's
read models are actors.operator.models, imported here).

The handlers send each answer through its model (an answer with a key the
model does not name is a bug, not a response), and the document's schemas are
these models' JSON schemas. Every key is always present; ``X | None`` is a
key whose value may be null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

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
    Job,
    JobDetail,
    JobRejection,
    LastOutcome,
    LocalTime,
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
    "Job",
    "JobDetail",
    "JobRejection",
    "LastOutcome",
    "Run",
    "RunDetail",
    "RunsPage",
]


_Answer = Answer


class Error(_Answer):
    error: str = Field(description="what is wrong, naming the field or value")


class Jobs(RootModel[list[Job]]):
    pass


class RejectedJob(_Answer):
    job: str
    path: str = Field(description="the config file")
    field: str | None
    error: str
    replica: str = Field(description="the replica whose load found it")
    recorded_at: UtcTime
    old_definition_running: bool = Field(
        description="the job is in the catalog and enabled: the definition it had before the "
        "rejected edit keeps running (false: the job does not run at all)"
    )


class RejectedJobs(RootModel[list[RejectedJob]]):
    pass


class ConfigGeneration(_Answer):
    generation: int = Field(description="its place in the order: the highest is in force")
    digest: str = Field(description="the digest of the file's jobs (first 12 hex characters)")
    config_version: int | None = Field(description="[claimd] config_version of the file")
    since: UtcTime
    replica: str = Field(description="the replica whose sync brought it into force")
    forced: bool = Field(description="brought back by `claimd reload --force` (a rollback)")


class ConfigReplica(_Answer):
    replica: str
    digest: str = Field(description="the digest of this replica's config file")
    config_version: int | None
    in_force: bool = Field(description="its file is the generation in force")
    stale: bool = Field(
        description="its file was refused as older than the generation in force (it runs the "
        "jobs in force)"
    )
    path: str
    seen_at: UtcTime


class ConfigRollout(_Answer):
    in_force: ConfigGeneration | None = Field(description="null before any sync")
    generations: list[ConfigGeneration] = Field(description="the latest, newest first")
    replicas: list[ConfigReplica] = Field(description="the replicas reporting now")
    digests: dict[str, int] = Field(description="replicas per file digest")
    disagreement: str | None = Field(
        description="'replicas disagree: 2 on digest A, 1 on digest B', or null"
    )


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


Count = Annotated[float, Field(ge=0)]


class Counters(_Answer):
    """What this replica counted since it started."""

    deliveries_skipped: Count
    deliveries_skipped_by_reason: dict[str, Count]
    fenced_completions: Count
    redeliveries: Count


class ReplicaStatus(_Answer):
    checks: dict[str, str] = Field(description="postgres and nats: 'ok', or what is wrong")
    counters: Counters
    config_rejected: list[RejectedJob] | None = Field(
        description="the jobs the config file rejected at its last load (null while the "
        "database cannot say)"
    )
    config: ConfigRollout | None = Field(
        default=None,
        description="the config generations and the replicas' files (null while the "
        "database cannot say)",
    )


class Document(RootModel[dict[str, Any]]):
    """The OpenAPI 3.1 document."""


class Metrics(RootModel[str]):
    """The Prometheus text exposition."""

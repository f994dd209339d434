"""What the server answers: every response body as a pydantic model.

The handlers send each answer through its model (an answer with a key the
model does not name is a bug, not a response), and the document's schemas are
these models' JSON schemas. Every key is always present; ``X | None`` is a
key whose value may be null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from actors.domain import RunState
from actors.domain.history import Status
from actors.http.openapi.fields import LocalTime, UtcTime, Uuid

TriggerName = Literal["schedule", "manual", "backfill"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(_Answer):
    error: str = Field(description="what is wrong, naming the field or value")


class Run(_Answer):
    id: Uuid
    job: str
    timezone: str
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    due_at: UtcTime
    state: RunState
    trigger: TriggerName
    attempt: int
    claim_epoch: int
    lease_owner: str | None
    lease_expires_at: UtcTime | None
    claimed_at: UtcTime | None
    started_at: UtcTime | None
    finished_at: UtcTime | None
    outcome: str | None
    exit_code: int | None
    error: str | None


class Attempt(_Answer):
    attempt: int
    claim_epoch: int
    worker: str | None
    started_at: UtcTime | None
    finished_at: UtcTime | None
    outcome: str = Field(
        description="the attempt's verdict; 'running' for the attempt running now, "
        "'cancelled' for one the run's cancel ended"
    )
    exit_code: int | None
    error: str | None
    output_tail: str | None = Field(
        default=None,
        description="the last bytes this attempt printed and logged, secrets scrubbed "
        "(none while it runs, and none for attempts recorded before claimd kept them)",
    )
    duration_s: float | None = Field(
        description="seconds from start to verdict (so far, while running)"
    )


class RunDetail(Run):
    output_tail: str | None
    lease_expired: bool
    attempts: list[Attempt]


class RunsPage(_Answer):
    runs: list[Run]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: the last")


class LastOutcome(_Answer):
    run_id: Uuid
    state: RunState
    outcome: str | None
    error: str | None
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    finished_at: UtcTime | None
    trigger: TriggerName = Field(description="who made the run: the schedule, or an operator")


class JobRejection(_Answer):
    path: str = Field(description="the config file")
    field: str | None
    error: str
    recorded_at: UtcTime


class Job(_Answer):
    name: str
    enabled: bool
    paused: bool
    schedule: str
    schedule_words: str = Field(description="the schedule in words (the zone apart)")
    timezone: str
    next_fire: UtcTime | None
    next_fire_local: LocalTime | None
    backlog: int = Field(description="due and not started (the look-ahead apart)")
    oldest_due: UtcTime | None
    oldest_due_age_s: float | None = Field(
        description="how long the oldest run due and not started has waited (database clock)"
    )
    ahead: int = Field(description="pending runs written ahead, not yet due")
    running: int
    pending: int = Field(description="backlog + ahead")
    last_outcome: LastOutcome | None
    last_success: UtcTime | None
    last_success_local: LocalTime | None
    failures_24h: int
    due_since: UtcTime | None
    config_rejected: JobRejection | None = Field(
        description="the config file's rejected edit of this job (its old definition keeps "
        "running), or null"
    )


class JobDetail(Job):
    recent_runs: list[Run]


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


class AuditRun(_Answer):
    id: Uuid
    state: RunState
    trigger: TriggerName
    attempt: int


class AuditEntry(_Answer):
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    status: Status
    problem: bool
    reason: str | None
    run: AuditRun | None


class AuditSummary(_Answer):
    due: int
    counts: dict[Status, int]
    problems: int
    not_yet_due: int
    complete: bool = Field(description="false too when the range names no instant of the schedule")
    instants: int = Field(description="instants of the schedule in the range")
    line: str


class Audit(_Answer):
    model_config = ConfigDict(populate_by_name=True)

    job: str
    timezone: str
    start: UtcTime = Field(alias="from")
    end: UtcTime = Field(alias="to")
    from_local: LocalTime
    to_local: LocalTime
    now: UtcTime
    due_since: UtcTime | None
    nearest_before: UtcTime | None = Field(
        description="when the range names no instant of the schedule: the last one before it"
    )
    nearest_before_local: LocalTime | None
    nearest_after: UtcTime | None = Field(
        description="when the range names no instant of the schedule: the first one after it"
    )
    nearest_after_local: LocalTime | None
    entries: list[AuditEntry]
    summary: AuditSummary


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

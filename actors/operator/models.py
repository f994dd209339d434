"""What an operator reads, declared once: one typed model per answer.

Each model is built once from the port's rows (``from_row``: the row's keys it
names, and what is derived from them), returned by the service
(actors.operator.reads), serialized by the API's handlers, written into
/openapi.json (actors.http.openapi), parsed back into the same model by the
commands' HTTP client (actors.cli.operator.connect) and rendered from its typed
values (actors.cli.operator.render). A field added to a listing is one line
here and its column in the SQL.

Every key is always present in an answer; ``X | None`` is a key whose value
may be null. Instants are ISO 8601 text (a ``datetime`` from a row becomes UTC
text), with the job's local time beside them where a reader wants it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from actors.domain import RunState
from actors.domain.history import Status
from actors.domain.job_state import JobState


def _utc_text(value: Any) -> Any:
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else value


def _uuid_text(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


UtcTime = Annotated[
    str,
    BeforeValidator(_utc_text),
    Field(json_schema_extra={"format": "date-time"}, description="UTC"),
]
LocalTime = Annotated[str, Field(description="the same instant in the job's time zone")]
Uuid = Annotated[str, BeforeValidator(_uuid_text), Field(json_schema_extra={"format": "uuid"})]
TriggerName = Literal["schedule", "manual", "backfill"]
OverlapName = Literal["queue", "allow", "forbid"]


class Answer(BaseModel):
    """An answer: no key the model does not name (that would be a bug, not a response)."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_row(cls, row: Mapping[str, Any], **derived: Any) -> Self:
        """The model from a store's row: the row's keys this model names (a column it
        does not name is ignored), then ``derived`` (what the row does not hold as is)."""
        named = {k: row[k] for k in cls.model_fields if k in row}
        return cls.model_validate({**named, **derived})

    def json_ready(self) -> Any:
        """What the API sends and ``--json`` prints."""
        return self.model_dump(mode="json", by_alias=True)


# --- runs and attempts ------------------------------------------------------------------


class Run(Answer):
    """One run as a listing shows it."""

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
    overlap: OverlapName | None = Field(
        description="the run's own overlap mode, as a trigger or backfill wrote it "
        "(null: the job's)"
    )


class Attempt(Answer):
    """One attempt of a run: a recorded verdict, or the attempt running now."""

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
    """One run with every attempt, its output's tail and whether its lease expired."""

    output_tail: str | None
    lease_expired: bool
    attempts: list[Attempt]


class RunsPage(Answer):
    runs: list[Run]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null: the last")


# --- jobs ---------------------------------------------------------------------------------


class LastOutcome(Answer):
    run_id: Uuid
    state: RunState
    outcome: str | None
    error: str | None
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    finished_at: UtcTime | None
    trigger: TriggerName = Field(description="who made the run: the schedule, or an operator")


class JobRejection(Answer):
    path: str = Field(description="the config file")
    field: str | None
    error: str
    recorded_at: UtcTime


class Job(Answer):
    """One job with its figures and its state, as the job list shows it."""

    name: str
    enabled: bool
    paused: bool
    state: JobState = Field(
        description="the job's state, decided once (actors.domain.job_state): the first of "
        "removed, paused, failing (its last finished run failed), overdue (a run due more "
        "than 10 s ago has not started), rejected (the config file rejected its last edit), "
        "running (its first run is running), healthy; the page, `claimd jobs` and the "
        "claimd_job_state metric show the same"
    )
    schedule: str
    schedule_words: str = Field(description="the schedule in words (the zone apart)")
    timezone: str
    next_fire: UtcTime | None
    next_fire_local: LocalTime | None
    backlog: int = Field(description="due and not started (the look-ahead apart; 0 while paused)")
    overdue: int = Field(
        description="of the backlog, the runs due more than 10 s ago (as claimd_job_overdue_runs)"
    )
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


# --- the audit's verdicts -------------------------------------------------------------------


class AuditRun(Answer):
    id: Uuid
    state: RunState
    trigger: TriggerName
    attempt: int


class AuditEntry(Answer):
    scheduled_at: UtcTime
    scheduled_local: LocalTime
    status: Status
    problem: bool
    reason: str | None
    run: AuditRun | None


class AuditSummary(Answer):
    due: int
    counts: dict[Status, int]
    problems: int
    not_yet_due: int
    complete: bool = Field(description="false too when the range names no instant of the schedule")
    instants: int = Field(description="instants of the schedule in the range")
    line: str


class Audit(Answer):
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


# --- the config file: rejected jobs, generations, replicas -----------------------------


class RejectedJob(Answer):
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


class ConfigGeneration(Answer):
    generation: int = Field(description="its place in the order: the highest is in force")
    digest: str = Field(description="the digest of the file's jobs (first 12 hex characters)")
    config_version: int | None = Field(description="[claimd] config_version of the file")
    since: UtcTime
    replica: str = Field(description="the replica whose sync brought it into force")
    forced: bool = Field(description="brought back by `claimd reload --force` (a rollback)")


class ConfigReplica(Answer):
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


class ConfigRollout(Answer):
    in_force: ConfigGeneration | None = Field(description="null before any sync")
    generations: list[ConfigGeneration] = Field(description="the latest, newest first")
    replicas: list[ConfigReplica] = Field(description="the replicas reporting now")
    digests: dict[str, int] = Field(description="replicas per file digest")
    disagreement: str | None = Field(
        description="'replicas disagree: 2 on digest A, 1 on digest B', or null"
    )


# --- a replica's own status (/api/status) ------------------------------------------------

Count = Annotated[float, Field(ge=0)]


class Counters(Answer):
    """What this replica counted since it started."""

    deliveries_skipped: Count
    deliveries_skipped_by_reason: dict[str, Count]
    fenced_completions: Count
    redeliveries: Count


class ReplicaStatus(Answer):
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

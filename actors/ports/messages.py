"""What crosses the ports: the values the stores, the broker and the actors hand each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from actors.domain import (
    AttemptVerdict,
    ExecutionResult,
    ExecutorSpec,
    Job,
    RetryPolicy,
    RunContext,
    RunState,
    StartRefusal,
)
from actors.domain.generations import ConfigIdentity, Generation, Standing


@dataclass(frozen=True)
class Materialized:
    """What one write of plans did: rows inserted, and instants recorded missed by job id.

    ``missed`` counts only the gaps this write recorded: a replica that planned
    the same dropped instants from the same mark records none (the first did),
    so the replicas' counters sum to what the history holds.
    """

    runs: int = 0
    missed: Mapping[int, int] = field(default_factory=dict)
    # The jobs whose plan was written (their marks are now the plans' marks).
    written: frozenset[int] = frozenset()
    # Plans refused because the job's mark had moved since it was read (another
    # replica planned it): the job id and its mark now. Plan again from there.
    moved: Mapping[int, datetime | None] = field(default_factory=dict)
    # Plans refused because the job is not the one planned: its definition
    # changed or it was removed since it was read (a reload). Planning it again
    # from the same copy is refused again: read the catalog first.
    superseded: frozenset[int] = frozenset()
    # Nothing was written: the plans were older than their on-time tolerance.
    stale: bool = False


@dataclass(frozen=True, slots=True)  # one per job in the materializer: 100,000 of them
class JobState:
    """A job as the materializer sees it in the store.

    The materializer plans from the stored definition, not from its own copy
    of the config file: every replica then plans the same instants, whichever
    of them synced last.
    """

    id: int
    name: str
    materialized_until: datetime | None
    paused: bool
    fingerprint: str
    definition: str  # JSON text; parsed once per fingerprint by its reader
    created_at: datetime | None = None  # the database's clock: where a new job's plan starts


@dataclass(frozen=True)
class DispatchMessage:
    """The body of one JetStream message: a run may be started under this epoch."""

    run_id: str
    epoch: int
    job: str
    scheduled_at: datetime
    attempt: int
    deployment: str
    # When the run is due (database clock): a worker holds a run claimed ahead
    # until then. None (a message from an older build): start at once.
    due_at: datetime | None = None
    # The kind of work ("python:<target>", "shell", "http"): an async python
    # callable runs without a process slot. None (older build): a slot.
    executor: str | None = None
    # The W3C trace context of the dispatch span (tracing on): carried in the
    # message's NATS headers, never in its body.
    trace_context: tuple[tuple[str, str], ...] = ()

    @property
    def msg_id(self) -> str:
        # The epoch is in the id so the broker dedupes retried publishes of one
        # claim but never drops a later, legitimate re-dispatch of the run.
        return f"{self.run_id}:{self.epoch}"


@dataclass(frozen=True)
class StartedRun:
    """A run the worker moved to running: what it executes and under which token."""

    run_id: str
    epoch: int
    job: str
    scheduled_at: datetime
    attempt: int
    max_attempts: int
    executor: ExecutorSpec
    timeout: timedelta
    retry: RetryPolicy  # the job's, as stored
    trigger: str = "schedule"  # schedule | manual | backfill
    due_at: datetime | None = None  # when it became due (instant + jitter, or retry time)
    # The dispatch message's trace context (tracing on): the run's span is its child.
    trace_context: tuple[tuple[str, str], ...] = ()

    def context(self) -> RunContext:
        return RunContext(
            run_id=self.run_id,
            job=self.job,
            scheduled_at=self.scheduled_at,
            attempt=self.attempt,
            fencing_token=self.epoch,
        )


@dataclass(frozen=True)
class NotStarted:
    """Why a delivered run was not started."""

    run_id: str
    epoch: int
    reason: StartRefusal
    state: RunState | None


@dataclass(frozen=True)
class Completion:
    """The verdict of one attempt, to be recorded under its epoch."""

    run_id: str
    epoch: int
    result: ExecutionResult
    # Where the run goes (actors.domain.decide_attempt); None: the result is
    # final (AttemptVerdict.final: succeeded, or failed without retry).
    verdict: AttemptVerdict | None
    worker: str


@dataclass(frozen=True, slots=True)  # one per job in each scrape's reading
class JobReading:
    """One job's cluster-wide figures as the store reads them (for /metrics)."""

    name: str
    paused: bool
    fingerprint: str
    definition: str | None  # None: it changed while being read (the next read has it)
    last_success: datetime | None  # finished_at of its latest succeeded run
    last_failure: datetime | None  # finished_at of its latest run failed for good
    overdue: int  # runs due more than OVERDUE_AFTER ago and not started (0 while paused)
    overdue_oldest_age: float  # seconds the oldest run due and not started has been due
    materialized_behind: float  # seconds its rows stop short of now (0 when ahead)
    # What its state is decided from too (actors.domain.job_state).
    last_state: str | None = None  # its last finished run's state
    running: int = 0
    rejected: bool = False  # the config file rejected it at the last load


@dataclass(frozen=True)
class RejectedJob:
    """A job the config file declares and the replica refused, in the loader's words."""

    job: str
    path: str
    field: str | None
    error: str


@dataclass(frozen=True)
class ClusterReading:
    """What every replica reports alike: read from the database, not counted locally."""

    jobs: tuple[JobReading, ...]
    claimed: int
    running: int
    past_lease: int


@dataclass(frozen=True)
class ConfigLoad:
    """One load of the config file, as the catalog takes it: the jobs it declares well,
    the file's identity (digest, version: actors.domain.generations), and the jobs it
    names but gets wrong, whose stored definitions are kept as they are."""

    jobs: Sequence[Job]
    file: ConfigIdentity
    keep: Sequence[str] = ()


@dataclass(frozen=True)
class ConfigSync:
    """A sync under the rollout rule (actors.domain.generations): the file's standing,
    the generation in force after it, and what the sync changed (nothing when stale)."""

    standing: Standing
    in_force: Generation
    changes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigReport:
    """One replica's report of its config file: the digest, and whether it was refused."""

    replica: str
    file: ConfigIdentity
    stale: bool
    path: str
    ttl: timedelta  # the report expires this long after it is written


@dataclass(frozen=True)
class ConfigReplica:
    """A replica reporting now: its file's digest and whether that file is refused."""

    replica: str
    file_digest: str
    config_version: int | None
    stale: bool
    path: str
    seen_at: datetime


@dataclass(frozen=True)
class ConfigRollout:
    """The generations in force (newest first) and the replicas reporting now."""

    generations: tuple[Generation, ...]
    replicas: tuple[ConfigReplica, ...]

    def file_digests(self) -> dict[str, int]:
        """How many replicas report each file digest."""
        counts: dict[str, int] = {}
        for r in self.replicas:
            counts[r.file_digest] = counts.get(r.file_digest, 0) + 1
        return counts

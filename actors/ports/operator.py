"""The operator side's port: what the CLI and the HTTP API read and do, without a driver.

``HistoryReader`` reads what happened (jobs, runs, attempts, gaps, the action
log); ``OperatorActions`` does what an operator can do (pause, resume,
trigger, backfill, cancel), each action and its record in ``operator_actions``
committed together. ``OperatorStore`` is both, what an adapter implements:
PostgreSQL (actors.adapters.postgres.operator_store) and the in-memory one
(actors.testing.memory_operator), held to the same contract tests.

Answers are plain values: the rows below are plain dicts (the keys the SQL
names; the listings' rows are read by the operator's models, the others are
TypedDicts), never a driver's records. A store's failures reach the
caller as the errors below (and ``StoreUnavailable`` for an outage), never as
a driver's exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, TypedDict

from actors.domain.backfill import BackfillProgress
from actors.domain.history import Gap, RunRecord
from actors.domain.jobs import Overlap
from actors.domain.pause import PausedInstants
from actors.ports.messages import ConfigRollout

# A job's rows and recorded gaps over a range, as the audit judges them.
Records = tuple[list[RunRecord], list[Gap]]
# From a pause to its resume (None: still paused), as the action log says.
PausedSpan = tuple[datetime, datetime | None]


@dataclass(frozen=True)
class Caller:
    """Who asked for an action, and how."""

    name: str  # OS user or --actor (CLI), the token's name (API)
    via: str  # cli | http | signal
    origin: str | None = None


@dataclass(frozen=True)
class Action:
    """One row of the action log to write: what was done (or refused), on which job or
    run, with which arguments, and how it ended (``result`` in the operator's words)."""

    name: str  # pause, resume, trigger, backfill, cancel, reload ...
    ok: bool
    result: str
    job: str | None = None
    run_id: str | None = None
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing holds, newest first by (scheduled_at, id): of one job (by id)
    or all, in these states, scheduled in [since, until], before the cursor ``before``
    (the last row's pair), at most ``limit``; only runs scheduled at or before now
    unless ``ahead``."""

    job_id: int | None = None
    states: Sequence[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    before: tuple[datetime, str] | None = None
    limit: int = 50
    ahead: bool = False


@dataclass(frozen=True)
class Recorded:
    """An action's row in the action log: its id and when it was written (store's clock)."""

    action_id: int
    at: datetime


@dataclass(frozen=True)
class Cancelled:
    """What a cancel found: ``recorded`` when it cancelled the run (``job`` is the run's),
    else the run's ``state`` (None: no such run)."""

    recorded: Recorded | None
    job: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class ActiveRun:
    """A run of a job that is claimed or running: what a new run of a forbid or queue
    job would wait for, or be skipped by."""

    run_id: str
    state: str


@dataclass(frozen=True)
class Resumed:
    """What a resume did with the instants that came due while the job was paused."""

    policy: str  # the job's catch-up policy, in the config's words
    paused_at: datetime | None  # when the pause took effect (None: not recorded)
    now: datetime  # the resume, on the store's clock
    due_now: int  # runs written ahead, due by now (run: they start now)
    unwritten: int  # instants up to now with no row yet (run: planned per catch-up)
    runs_skipped: int = 0  # skip: runs written ahead, now skipped
    gaps: tuple[Gap, ...] = ()  # skip: the unwritten instants, recorded as gaps


class Unchanged(Enum):
    """Why a pause or resume changed nothing."""

    UNKNOWN_JOB = "no enabled job has the name"
    ALREADY = "the job already is so"


class UnknownJob(LookupError):
    """An operator action named a job the config file never declared (or no longer does)."""


class SchemaMissing(Exception):
    """The store has no claimd schema, or an older one: `claimd migrate` first."""


class StoreRefused(Exception):
    """The store answered with an error about the request (not an outage)."""


class JobRecord(TypedDict):
    """One job as an action or the audit reads it, with the store's now."""

    id: int
    name: str
    definition: str  # JSON text (actors.domain.encode_job)
    enabled: bool
    paused: bool
    history_pruned_through: datetime | None
    due_since: datetime | None
    timezone: str
    now: datetime


# A row of a listing as the SQL names its columns (a plain dict, never a driver's
# record). The operator's read models (actors.operator.models) take the columns they
# name from it: a field added to a listing is declared there and in the SQL, not here.
Row = Mapping[str, Any]
JobOverview = Row  # one job with its figures (JOBS_OVERVIEW)
RunListing = Row  # one run as a listing shows it (RUNS_PAGE)
RunDetail = Row  # one run, its output's tail and the store's ``now`` (RUN_DETAIL)
RunRow = Row


class AttemptRecord(TypedDict):
    """One finished attempt of a run (``job_run_attempts``)."""

    attempt: int
    claim_epoch: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    exit_code: int | None
    error: str | None
    output_tail: str | None  # what this attempt printed and logged (None before sql/0014)


class RejectedRecord(TypedDict):
    """A job the config file rejected at its last load."""

    job: str
    path: str
    field: str | None
    error: str
    replica: str | None
    recorded_at: datetime
    old_definition_running: bool


class ActionRecord(TypedDict):
    """One row of the action log; ``arguments`` is JSON text."""

    id: int
    at: datetime
    actor: str
    via: str
    origin: str | None
    action: str
    job: str | None
    run_id: str | None
    arguments: str
    ok: bool
    result: str


class HistoryReader(Protocol):
    """What happened: jobs, runs, attempts, gaps, rejected jobs and the action log."""

    async def now(self) -> datetime:
        """The store's clock (the database's now())."""
        ...

    async def jobs(self, name: str | None = None) -> list[JobOverview]:
        """Every job (or the one named), by name."""
        ...

    async def job(self, name: str) -> JobRecord | None: ...
    async def runs(self, wanted: RunFilter) -> list[RunListing]:
        """Newest first by (scheduled_at, id), as ``wanted`` says (RunFilter)."""
        ...

    async def run(self, run_id: str) -> tuple[RunDetail, list[AttemptRecord]] | None:
        """The run and its recorded attempts (by finish, then epoch), in one snapshot."""
        ...

    async def audit_records(
        self, job_id: int, start: datetime, end: datetime, limit: int
    ) -> tuple[list[RunRecord], list[Gap]]:
        """The rows and gaps of a job in ``[start, end]``, read in one snapshot."""
        ...

    async def paused_spans(self, job: str) -> list[PausedSpan]:
        """From each pause to its resume (None: still paused), as the action log says."""
        ...

    async def grid_records(
        self, ranges: Sequence[tuple[int, datetime]], end: datetime, limit: int
    ) -> dict[int, Records]:
        """Each job's rows (at most ``limit``) and gaps in ``[start, end]``, by job id
        (``ranges``: job id and its start), every job read in one snapshot."""
        ...

    async def paused_spans_of(self, jobs: Sequence[str]) -> dict[str, list[PausedSpan]]:
        """The paused spans of each job named (absent: never paused), by job name."""
        ...

    async def rejected_jobs(self) -> list[RejectedRecord]: ...
    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """The latest config generations, newest first, and the replicas reporting now."""
        ...

    async def last_action_id(self) -> int:
        """The newest action's id (0: none)."""
        ...

    async def reload_verdict(self, pid: int, after: int) -> tuple[bool, str, dict[str, Any]] | None:
        """What replica ``pid`` recorded for a reload after action ``after``, if anything yet:
        ok, the result, and what it changed or each error (actors.replica.reload)."""
        ...

    async def actions(
        self, *, job: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[ActionRecord]:
        """The action log, newest first (by id), those before id ``before``."""
        ...


class OperatorActions(Protocol):
    """What an operator can do; each action that happens is recorded with it, atomically."""

    async def record_action(self, actor: Caller, action: Action) -> Recorded:
        """Write one row of the action log (a refusal, a backfill done, a reload)."""
        ...

    async def pause(self, actor: Caller, job: str, *, result: str) -> Recorded | Unchanged:
        """Pause ``job`` and record it with ``result``, in one transaction; or why
        nothing changed (and nothing was recorded)."""
        ...

    async def resume(
        self,
        actor: Caller,
        job: str,
        paused_instants: PausedInstants,
        *,
        arguments: dict[str, Any],
        result: Callable[[Resumed], str],
    ) -> tuple[Resumed, Recorded] | Unchanged:
        """Unpause ``job`` and record it with ``result(resumed)``, in one transaction.

        With ``SKIP`` none of the instants due while it was paused runs: each
        run written ahead ends skipped and each unwritten instant is recorded
        as a gap, both with the reason "paused ..." (actors.domain.pause), and
        the plan goes on from now. Or why nothing changed.
        """
        ...

    async def trigger(
        self,
        actor: Caller,
        job: str,
        at: datetime,
        *,
        arguments: dict[str, Any],
        result: Callable[[str], str],
        overlap: Overlap | None = None,
    ) -> tuple[str, Recorded] | None:
        """A run of ``job`` for instant ``at``, due now, recorded with ``result(run_id)``.

        ``overlap``: the run's own overlap mode (sql/0015; None: the job's).
        None (nothing written) when the instant has a row; UnknownJob when no
        enabled job has the name.
        """
        ...

    async def active_run(self, job: str) -> ActiveRun | None:
        """A run of ``job`` claimed or running (the earliest instant), if any."""
        ...

    async def backfill(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_runs: int,
        progress: Callable[[BackfillProgress], None] | None = None,
        overlap: Overlap | None = None,
    ) -> BackfillProgress:
        """One run per instant of the schedule in ``[start, end]`` that has no row yet,
        in chunks that commit one by one, each with ``overlap`` as its own overlap mode
        (None: the job's); UnknownJob, or BackfillTooLarge before anything is written."""
        ...

    async def cancel(self, actor: Caller, run_id: str, *, reason: str, result: str) -> Cancelled:
        """Cancel a pending, claimed or running run and record it, in one transaction."""
        ...

    async def close(self) -> None: ...


class OperatorStore(HistoryReader, OperatorActions, Protocol):
    """The operator side's store: its reads and its actions."""

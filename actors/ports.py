"""Ports: what the actors need from the world, as typing.Protocol.

The actors speak only to these; adapters (PostgreSQL, NATS JetStream,
executors) implement them. A fake that satisfies a port is fine for a unit
test of an actor's logic, never as the proof of the distributed behaviour.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from actors.domain import (
    AttemptVerdict,
    ClaimedRun,
    ExecutionResult,
    ExecutorSpec,
    Job,
    Plan,
    RetryPolicy,
    RunContext,
    RunState,
)


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
    reason: str  # terminal | owned | stale | unknown | unreadable | skipped | early
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
    overdue: int  # runs due and not started (0 while paused)
    overdue_oldest_age: float  # seconds the oldest of them has been due
    materialized_behind: float  # seconds its rows stop short of now (0 when ahead)


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


class Outage(Exception):
    """A server claimd needs is unreachable or restarting; trying again later is right.

    The supervisor restarts an actor that raises it with a short backoff and
    does not count it against the actor's crash budget: a database restart is
    not a bug, and must not make the process give up.
    """


class StoreUnavailable(Outage):
    """The database cannot be reached (refused, reset, shutting down, starting up)."""


class RecordRejected(Exception):
    """The store refused a write for what it contains, not for being unreachable.

    Retrying the same write cannot succeed; callers split or give up instead.
    """


class RunStore(Protocol):
    """The only thing that knows the database."""

    async def ping(self) -> None: ...
    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]: ...
    async def database_now(self) -> datetime: ...
    async def active_jobs(self) -> dict[str, JobState]: ...
    async def catalog_version(self) -> int:
        """A number that moves whenever ``active_jobs`` would answer differently.

        Not for the high-water marks: those move with every plan, and a write
        from a mark that moved is refused and answered with the mark now.
        """
        ...

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized: ...
    async def skip_unrunnable(self, limit: int) -> list[tuple[str, str]]: ...
    async def claim_due_runs(
        self,
        owner: str,
        limit: int,
        lease: timedelta,
        max_claimed: int,
        ahead: timedelta = timedelta(0),
    ) -> list[ClaimedRun]:
        """Claim runs due by ``now() + ahead`` (those not yet due are held by their worker)."""
        ...

    async def next_due_in(self, ahead: timedelta) -> timedelta | None:
        """How long until the soonest pending run not claimable now is due (database clock).

        Only runs due after ``now() + ahead``: one due already but left unclaimed
        (over the bound, an exclusive job's next) is the poll's to retry, not a
        reason to wake at once. None when there is none.
        """
        ...

    async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int: ...
    async def start_runs(
        self,
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> tuple[list[StartedRun], list[NotStarted]]:
        """Start the claimed runs the messages carry; say why each other one did not start.

        A run already running under ``worker`` and the message's epoch is taken
        up again only when its (run id, epoch) is in ``retake``: the worker's
        earlier start of it committed but the reply was lost, so it never began
        executing it. Any other such run is left to its lease ("owned").
        """
        ...

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int: ...
    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]: ...
    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]: ...
    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]: ...
    async def prune_history(self, older_than: timedelta, batch: int) -> int: ...
    async def cancel_orphaned_runs(self) -> int: ...


class ReplicaStore(RunStore, Protocol):
    """What a replica asks of its store besides the actors' port: start, status, stop."""

    async def migrate(self) -> list[str]:
        """Apply the migrations not applied yet; their names."""
        ...

    async def close(self) -> None: ...
    async def jobs_summary(self) -> list[dict[str, Any]]:
        """The status page's job list: name, enabled, paused, pending, last_success."""
        ...

    async def cluster_figures(self, timeout: float) -> ClusterReading: ...
    async def record_reload(
        self, replica_id: str, arguments: dict[str, Any], ok: bool, result: str
    ) -> None:
        """Record a SIGHUP reload as an operator action."""
        ...

    async def record_rejected_jobs(self, replica_id: str, rejected: Sequence[RejectedJob]) -> None:
        """Replace the record of the jobs the config file rejected with ``rejected``.

        The last load wins, whichever replica made it, as the last sync's
        definitions do: the config is the deployment's, not one replica's.
        """
        ...


class Broker(Protocol):
    """The dispatch channel (NATS JetStream in production)."""

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        """Publish concurrently; one entry per message, None where the broker acked."""
        ...


class Delivery(Protocol):
    """One dispatch as the worker receives it: the message, already decoded, and its verdicts.

    ``ack``: done with (recorded, or nothing to do). ``nak``: deliver it again
    after ``delay`` seconds. ``term``: never deliver it again. ``in_progress``:
    still being worked on (resets the broker's redelivery timer).
    """

    @property
    def message(self) -> DispatchMessage: ...
    @property
    def delivery_count(self) -> int:
        """How many times this message was delivered, this time included (1 the first time)."""
        ...

    async def ack(self) -> None: ...
    async def nak(self, delay: float | None = None) -> None: ...
    async def term(self) -> None: ...
    async def in_progress(self) -> None: ...


class InboxSilent(Outage):
    """Fetches came back empty and the broker did not answer a ping: it may be away."""


class Inbox(Protocol):
    """The consuming side of the dispatch channel (NATS JetStream in production).

    What is not a dispatch of this deployment never comes out of it (the
    adapter terminates it, counts and logs it); a consumer that disappeared is
    bound again inside it.
    """

    async def fetch(self, batch: int, timeout: float) -> Sequence[Delivery]:
        """Up to ``batch`` deliveries, waiting about ``timeout`` for them; empty if none came.

        Raises InboxSilent when fetches stay empty and the broker does not
        answer (wait in :meth:`reconnect`), and any other error when a fetch
        failed (back off and fetch again).
        """
        ...

    async def reconnect(self) -> bool:
        """After InboxSilent: one round trip to the broker; True once it answered.

        When it answers, the inbox binds its consumer anew (a broker recreated
        without its data has lost it).
        """
        ...


class ReplicaBroker(Broker, Protocol):
    """What a replica asks of its broker besides publishing: probes, readiness, stop."""

    # A publish's deadline, in seconds: also the deadline of the probe that
    # reopens claiming after publishes failed.
    publish_timeout: float

    async def probe(self, timeout: float) -> None:
        """A round trip within about ``timeout``; raises if there is none."""
        ...

    async def ready(self, timeout: float) -> str:
        """/readyz's verdict ("ok", or what is wrong); raises when the round trip fails."""
        ...

    async def close(self) -> None: ...


class Executor(Protocol):
    """Runs one attempt and reports; never raises for a failing job."""

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult: ...

    def runs_inline(self, executor: str | None) -> bool:
        """Whether runs of that kind (a dispatch's ``executor`` hint) execute on the event
        loop (async python callables: the worker's inline pool) rather than in a slot."""
        ...


class Clock(Protocol):
    """Wall-clock time, injectable so that schedules are tested without waiting."""

    def now(self) -> datetime: ...


class DatabaseTime(Protocol):
    """The database's clock: the one every decision about time is made on.

    Read once per tick (one round trip) and passed into the pure domain, so
    replicas whose own clocks disagree still plan the same rows.
    """

    async def read(self) -> datetime: ...


Callback = Callable[..., Awaitable[Any]]

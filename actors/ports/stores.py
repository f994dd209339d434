"""The store's ports, one per role: each actor is handed the part of the store it needs.

``PlanningStore`` (the materializer), ``ClaimingStore`` (the claimer and the
compensator), ``WorkerStore`` (the worker), ``ReapingStore`` (the reaper) and
``OperatingStore`` (the replica itself: sync, status, stop). ``RunStore`` is the
four actor roles with the catalog's sync; ``ReplicaStore`` is all of them, what
an adapter implements (PostgreSQL, and the in-memory store held to the same
contract tests, tests/contract).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from actors.domain import ClaimedRun, Job, Plan, SkipReason
from actors.ports.messages import (
    ClusterReading,
    Completion,
    ConfigLoad,
    ConfigReport,
    ConfigRollout,
    ConfigSync,
    DispatchMessage,
    JobState,
    Materialized,
    NotStarted,
    RejectedJob,
    StartedRun,
)
from actors.ports.operator import Action


class PlanningStore(Protocol):
    """The materializer's: the active jobs, and their plans written behind their marks."""

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


class ClaimingStore(Protocol):
    """The claimer's and the compensator's: skip, claim, wake, hand back what was not sent."""

    async def skip_unrunnable(self, limit: int) -> list[tuple[str, SkipReason]]: ...
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


class WorkerStore(Protocol):
    """The worker's: start, heartbeat, complete, hand back on a stop; ping while idle."""

    async def ping(self) -> None: ...
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
        executing it. Any other such run is left to its lease (``StartRefusal.OWNED``).
        """
        ...

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int: ...
    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]: ...
    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]: ...


class ReapingStore(Protocol):
    """The reaper's: expired leases, orphaned runs, the history past its retention."""

    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]: ...
    async def prune_history(self, older_than: timedelta, batch: int) -> int: ...
    async def cancel_orphaned_runs(self) -> int: ...


class OperatingStore(Protocol):
    """The replica's own: migrate, sync the catalog, the clock, status, records, stop."""

    async def ping(self) -> None: ...
    async def migrate(self) -> list[str]:
        """Apply the migrations not applied yet; their names."""
        ...

    async def close(self) -> None: ...
    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]: ...
    async def database_now(self) -> datetime: ...
    async def cluster_figures(self, timeout: float) -> ClusterReading: ...
    async def record_reload(
        self, replica_id: str, reload: Action, *, by_signal: bool = True
    ) -> None:
        """Record ``reload`` as an operator action: a signal's (SIGHUP, SIGUSR1), or the
        config watch's (``by_signal=False``: not a verdict `claimd reload` waits for)."""
        ...

    async def record_rejected_jobs(self, replica_id: str, rejected: Sequence[RejectedJob]) -> None:
        """Replace the record of the jobs the config file rejected with ``rejected``.

        The last load wins, whichever replica made it, as the last sync's
        definitions do: the config is the deployment's, not one replica's.
        """
        ...

    async def sync_config(
        self, load: ConfigLoad, replica_id: str, *, force: bool = False
    ) -> ConfigSync:
        """``sync_jobs`` under the rollout rule (actors.domain.generations), in one turn of
        the sync lock: a stale file changes nothing; a newer (or forced) one becomes the
        generation in force."""
        ...

    async def report_config(self, report: ConfigReport) -> None:
        """Replace this replica's report of its config file (expired ones are dropped)."""
        ...

    async def forget_config_replica(self, replica_id: str) -> None: ...
    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """The latest generations, newest first, and the replicas reporting now."""
        ...


class RunStore(PlanningStore, ClaimingStore, WorkerStore, ReapingStore, Protocol):
    """Every actor's role in one, with the catalog's sync and the clock."""

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]: ...
    async def database_now(self) -> datetime: ...


class ReplicaStore(RunStore, OperatingStore, Protocol):
    """What a replica is handed and an adapter implements: every role."""

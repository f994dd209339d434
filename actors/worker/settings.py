"""What a worker is told: its identity and its bounds, read from the config in one place."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from actors.config import Settings
from actors.domain import DEFAULT_LEASE, defaults
from actors.domain.lease import stall_after

DEFAULT_MAX_HOLD = DEFAULT_LEASE.max_hold()
DEFAULT_KEEP_HELD_ALIVE = DEFAULT_LEASE.keep_held_alive()


@dataclass(frozen=True)
class WorkerSettings:
    worker_id: str  # the lease owner its runs are recorded under
    deployment: str
    lease: timedelta
    heartbeat_interval: timedelta
    concurrency: int  # runs executing at once, at most
    grace: timedelta  # at a stop, how long in-flight runs may finish
    # The longest a run claimed ahead is held before it is tried (lease / 8).
    max_hold: timedelta = DEFAULT_MAX_HOLD
    # Async python callables executing at once, at most (their own pool).
    inline_concurrency: int = defaults.WORKER_ASYNC_CONCURRENCY
    # A held delivery tells the broker it is still held this often (ack_wait / 3).
    keep_held_alive: timedelta = DEFAULT_KEEP_HELD_ALIVE
    # A database call unanswered this long is failing (None: stall_after, domain/lease.py,
    # from the lease): the leases it would extend are running out.
    stall_after: timedelta | None = None

    @property
    def stall_threshold(self) -> timedelta:
        if self.stall_after is not None:
            return self.stall_after
        return stall_after(self.lease)

    @classmethod
    def from_config(cls, settings: Settings, worker_id: str) -> WorkerSettings:
        return cls(
            worker_id=worker_id,
            deployment=settings.deployment,
            lease=settings.lease,
            heartbeat_interval=settings.lease_settings.heartbeat_interval(),
            concurrency=settings.worker_concurrency,
            grace=settings.shutdown_grace,
            max_hold=settings.lease_settings.max_hold(),
            inline_concurrency=settings.worker_async_concurrency,
            keep_held_alive=settings.lease_settings.keep_held_alive(),
        )

"""The ports a replica is composed from, as one bundle.

A replica never names a driver: it asks its ``PortBundle`` for a store, a
broker, the worker's inbox, an executor and the database's
clock. ``actors.replica.production`` builds them on PostgreSQL and NATS
JetStream; ``actors.testing.memory_replica`` in memory, so that the actors
and a whole replica run in a unit test without a server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Protocol

from actors.observability import DependencyHealth
from actors.operator import OperatorService
from actors.ports import Executor, Inbox, OutputFeed, ReplicaBroker, ReplicaStore, WorkerStore
from actors.ports.notify import NotificationStore, SinkSender
from actors.scheduling.database_clock import DatabaseClock


class PortBundle(Protocol):
    """How one replica reaches the world."""

    # The dependency gauges the replica's readiness verdicts set.
    store_health: DependencyHealth
    broker_health: DependencyHealth

    async def open_store(self) -> ReplicaStore:
        """Connected and migrated; raises what ``store_unreachable`` may call transient."""
        ...

    def store_unreachable(self, exc: BaseException) -> bool:
        """Whether an error opening the store is worth waiting out (not a bad password)."""
        ...

    async def open_broker(self) -> ReplicaBroker:
        """Connected; every error is waited out (an authorization error is logged each time)."""
        ...

    async def prepare_broker(self, broker: ReplicaBroker) -> None:
        """The stream and the workers' consumer, created or updated; a refusal raises."""
        ...

    async def worker_inbox(
        self, broker: ReplicaBroker, probe: Callable[[], Awaitable[None]], stall: timedelta
    ) -> Inbox:
        """The worker's inbox on ``broker``; ``probe`` pings it, within ``stall`` at most."""
        ...

    def worker_store(self, store: ReplicaStore) -> WorkerStore:
        """The store the worker records through: ``store`` itself in production (the
        chaos harness's broken builds wrap it, in tests/chaos/broken.py)."""
        ...

    def executor(self) -> Executor: ...
    def output_feed(self) -> OutputFeed | None:
        """Where the API follows runs' live output (None: the API streams the kept tails only)."""
        ...

    def database_clock(self, store: ReplicaStore) -> DatabaseClock: ...
    def pending_listener(
        self, store: ReplicaStore, on_pending: Callable[[datetime], None]
    ) -> Callable[[asyncio.Event], Awaitable[None]] | None:
        """A loop (until its stop event) calling ``on_pending(due_at)`` when runs become
        pending (LISTEN/NOTIFY on PostgreSQL); None where the store has no such channel."""
        ...

    async def open_operator(self, store: ReplicaStore) -> OperatorService | None:
        """The operator API's service (on a small pool of its own on PostgreSQL, so that
        API clients never wait for, nor hold, the scheduler's connections); None: the API
        keeps answering 503. The replica closes its store (``history.close()``)."""
        ...

    def notifications(self, store: ReplicaStore) -> tuple[NotificationStore, SinkSender] | None:
        """The notification outbox and the sinks' senders; None: no notifier runs."""
        ...

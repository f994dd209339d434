"""A replica's PortBundle in memory: the whole replica in a unit test, no server.

The store, the broker, the worker's inbox and the executor are the test's
(so it can look at them and move the store's clock); the inbox is subscribed
to the broker when the worker asks for it. The operator API answers from
the same store (actors.testing.memory_operator).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from actors.observability import DependencyHealth
from actors.operator import OperatorService
from actors.ports import Clock, Executor, Inbox, ReplicaBroker, ReplicaStore, WorkerStore
from actors.scheduling.database_clock import DatabaseClock
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.testing.memory_operator import InMemoryOperatorStore

MEMORY_HEALTH = DependencyHealth("memory")


@dataclass
class MemoryPorts:
    """PortBundle on an InMemoryRunStore and an InMemoryBroker."""

    store: InMemoryRunStore
    broker: InMemoryBroker
    executor_: Executor
    inbox: MemoryInbox
    local_clock: Clock | None = None  # the replica's own clock; default: the store's
    store_health: DependencyHealth = field(default=MEMORY_HEALTH)
    broker_health: DependencyHealth = field(default=MEMORY_HEALTH)
    opened: int = 0

    def __post_init__(self) -> None:
        if self.store.health is None:  # its calls report as PostgreSQL's do
            self.store.health = self.store_health

    async def open_store(self) -> ReplicaStore:
        await self.store.ping()  # raises the store's outage, if one is set
        self.store.closed = False
        self.opened += 1
        return self.store

    def store_unreachable(self, exc: BaseException) -> bool:
        return True

    async def open_broker(self) -> ReplicaBroker:
        await self.broker.probe(1.0)
        self.broker.closed = False
        return self.broker

    async def prepare_broker(self, broker: ReplicaBroker) -> None:
        return None

    async def worker_inbox(
        self, broker: ReplicaBroker, probe: Callable[[], Awaitable[None]], stall: timedelta
    ) -> Inbox:
        if self.inbox not in self.broker.sinks:
            self.broker.subscribe(self.inbox)
        return self.inbox

    def worker_store(self, store: ReplicaStore) -> WorkerStore:
        return store

    def executor(self) -> Executor:
        return self.executor_

    def output_feed(self) -> None:
        return None  # in memory, the API streams the kept tails only

    def database_clock(self, store: ReplicaStore) -> DatabaseClock:
        local = self.local_clock or self.store.clock
        if not isinstance(local, ManualClock):
            return DatabaseClock(store, local=local)
        # Round trips timed on the manual clock too, where they take no time. Timed
        # on the real monotonic clock, each read "measured" a skew of half a real
        # round trip between the store's clock and itself: the estimate stayed a
        # microsecond behind the store's clock, which only the test moves, so a run
        # held until its instant never came due on it, and the worker's hold spun
        # until some read happened to round its round trip to zero (1-5 s of real
        # time, more on a loaded machine).
        return DatabaseClock(store, local=local, monotonic=lambda: local.now().timestamp())

    def pending_listener(
        self, store: ReplicaStore, on_pending: Callable[[datetime], None]
    ) -> Callable[[asyncio.Event], Awaitable[None]] | None:
        return None  # no NOTIFY in memory: the claimer's next-due read and poll do

    async def open_operator(self, store: ReplicaStore) -> OperatorService | None:
        return OperatorService(InMemoryOperatorStore(self.store))

    def notifications(self, store: ReplicaStore) -> None:
        return None  # the outbox is PostgreSQL's (its trigger and unique key)

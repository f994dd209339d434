"""The production adapters: PostgreSQL (asyncpg) and NATS JetStream (nats-py).

The one place a replica's drivers are named. Nothing here reads a fault
switch: the chaos harness builds its broken replicas on adapters of its own
(tests/chaos/broken.py), through an entry point of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from actors.adapters.executors import LocalExecutor
from actors.adapters.live_output import LiveOutputExecutor, OutputRelay
from actors.adapters.nats import NATS_HEALTH, JetStreamBroker
from actors.adapters.nats_inbox import PROBE_TIMEOUT_S, JetStreamInbox, PullSubscription
from actors.adapters.notify_senders import NotificationSenders
from actors.adapters.postgres import (
    POSTGRES_HEALTH,
    PostgresOperatorStore,
    PostgresRunStore,
    is_unreachable,
)
from actors.adapters.postgres.notifications import PostgresNotificationStore
from actors.adapters.postgres.notify import PendingRunsListener
from actors.adapters.postgres.pool import connect_pool, init_connection
from actors.config import Settings
from actors.observability import DependencyHealth, get_logger
from actors.operator import OperatorService
from actors.ports import (
    Executor,
    Inbox,
    Outage,
    OutputFeed,
    ReplicaBroker,
    ReplicaStore,
    WorkerStore,
)
from actors.ports.notify import NotificationStore, SinkSender
from actors.scheduling.database_clock import DatabaseClock

log = get_logger("replica")
# The operator API's own pool: a few reads at once, apart from the scheduler's pool.
API_POOL_SIZE = 4


@dataclass
class ProductionPorts:
    """The PortBundle of `claimd run` and `claimd dev`, from the ``[claimd]`` settings."""

    settings: Settings
    replica_id: str
    store_health: DependencyHealth = POSTGRES_HEALTH
    broker_health: DependencyHealth = NATS_HEALTH
    _jetstream: JetStreamBroker | None = field(default=None, init=False)
    # Live output (actors/adapters/live_output.py): published and followed on the
    # broker's connection, under the deployment's subjects.
    _live: OutputRelay | None = field(default=None, init=False)

    def _relay(self) -> OutputRelay:
        if self._live is None:  # made at first use: the settings are read then
            self._live = OutputRelay(f"claimd.{self.settings.deployment}")
        return self._live

    async def open_store(self) -> ReplicaStore:
        settings = self.settings
        store = await PostgresRunStore.connect(
            settings.database_url,
            max_size=min(20, 4 + settings.worker_concurrency),
            timeouts=settings.timeouts,
        )
        try:
            applied = await store.migrate()
        except BaseException:
            await store.close()
            raise
        if applied:
            log.info("migrated", applied=applied)
        return store

    def store_unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, Outage) or is_unreachable(exc)

    async def open_broker(self) -> ReplicaBroker:
        settings = self.settings
        self._jetstream = await JetStreamBroker.connect(
            settings.nats_servers,
            settings.stream,
            settings.subject,
            name=self.replica_id,
            tls_ca=settings.nats_tls_ca,
            timeouts=settings.timeouts,
        )
        await self._relay().attach(self._jetstream.nc)
        return self._jetstream

    async def prepare_broker(self, broker: ReplicaBroker) -> None:
        """The stream and the durable consumer, created or updated (idempotent)."""
        settings = self.settings
        jetstream = self._opened()
        await jetstream.ensure_stream(
            settings.duplicate_window,
            max_age=settings.lease_settings.stream_max_age(settings.duplicate_window),
            replicas=settings.stream_replicas,
        )
        await jetstream.ensure_consumer(
            settings.ack_wait,
            settings.max_deliver,
            max_ack_pending=max(10_000, settings.max_claimed * 2),
        )

    async def worker_inbox(
        self, broker: ReplicaBroker, probe: Callable[[], Awaitable[None]], stall: timedelta
    ) -> Inbox:
        jetstream = self._opened()

        async def resubscribe() -> PullSubscription:
            await self.prepare_broker(broker)
            return await jetstream.pull_subscription()

        return JetStreamInbox(
            await jetstream.pull_subscription(),
            self.settings.deployment,
            rebind=resubscribe,
            probe=probe,
            probe_timeout=min(PROBE_TIMEOUT_S, stall.total_seconds()),
        )

    def worker_store(self, store: ReplicaStore) -> WorkerStore:
        return store

    def executor(self) -> Executor:
        # Python jobs get neither claimd's CLAIMD_* settings nor its API token.
        token = self.settings.api_token_env
        local = LocalExecutor(
            withheld_env=() if token is None else (token,),
            python_processes=self.settings.python_processes or self.settings.worker_concurrency,
        )
        return LiveOutputExecutor(local, self._relay())

    def output_feed(self) -> OutputFeed | None:
        return self._relay()

    def database_clock(self, store: ReplicaStore) -> DatabaseClock:
        return DatabaseClock(store)

    def pending_listener(
        self, store: ReplicaStore, on_pending: Callable[[datetime], None]
    ) -> Callable[[asyncio.Event], Awaitable[None]] | None:
        return PendingRunsListener(_postgres(store).pool, on_pending).run

    async def open_operator(self, store: ReplicaStore) -> OperatorService | None:
        """The API's service on a pool of its own (API_POOL_SIZE connections at most).

        A flood of API reads queues on this pool, never on the scheduler's: the
        claimer, the workers' completions and the reaper keep their connections.
        If it cannot be opened now, the API shares the scheduler's pool (logged).
        """
        settings = self.settings
        try:
            pool = await connect_pool(
                settings.database_url,
                settings.timeouts,
                min_size=1,
                max_size=API_POOL_SIZE,
                init=init_connection,
            )
        except Exception as exc:  # noqa: BLE001 - any failure: the shared pool still serves
            log.warning(
                "api: own database pool unavailable; sharing the replica's", error=repr(exc)
            )
            shared = PostgresOperatorStore(_postgres(store).pool, health=self.store_health)
            return OperatorService(shared)
        return OperatorService(
            PostgresOperatorStore(pool, owns_pool=True, health=self.store_health)
        )

    def notifications(self, store: ReplicaStore) -> tuple[NotificationStore, SinkSender] | None:
        if not isinstance(store, PostgresRunStore):
            return None  # a store wrapped by a test's broken build: no notifier
        return PostgresNotificationStore(store.pool), NotificationSenders()

    def _opened(self) -> JetStreamBroker:
        """The JetStream broker open_broker connected (a subclass's open_broker may wrap
        what it returns; the stream and consumer are still this one's)."""
        assert self._jetstream is not None, "open_broker first"
        return self._jetstream


def _postgres(store: ReplicaStore) -> PostgresRunStore:
    assert isinstance(store, PostgresRunStore), "opened by ProductionPorts.open_store"
    return store

"""One claimd replica: HTTP first, then its servers, then the actors of its role, supervised.

Composed from ports (``PortBundle``): ``actors.replica.production`` on
PostgreSQL and NATS JetStream by default, or any other bundle (in memory, for
a unit test of the whole replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from actors.config import LoadedConfig
from actors.domain import Job
from actors.http.api import OperatorApi
from actors.http.api.live import MAX_STREAMS
from actors.http.guard import Guard, connection_cap
from actors.http.server import build_app, serve
from actors.observability import (
    get_logger,
    init_job_series,
    init_series,
    per_job_histograms,
    redact,
)
from actors.operator import OperatorService, Unavailable
from actors.ports import Outage, ReplicaStore
from actors.replica.config_watch import ConfigWatch
from actors.replica.lifecycle import (
    EXIT_MARGIN_S,
    STOP_MARGIN_S,
    STOP_SIGNALS,
    arm_exit_watchdog,
    cancel_within,
    off_signals,
    on_signals,
    stop_bound,
    until_connected,
)
from actors.replica.port_bundle import PortBundle
from actors.replica.reload import JobsConfig
from actors.replica.status import ReplicaStatus
from actors.replica.wiring import ReplicaPorts, Role, run_actors

log = get_logger("replica")


class _UntilConnected:
    """The operator service's stand-in until PostgreSQL is connected: every call is a 503."""

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def unavailable(*_: Any, **__: Any) -> Any:
            raise Unavailable("not connected to PostgreSQL yet; try again")

        return unavailable


def _production(replica: Replica) -> PortBundle:
    from actors.replica.production import ProductionPorts

    return ProductionPorts(replica.config.settings, replica.replica_id)


@dataclass
class Replica:
    """Everything one process runs."""

    config_path: Path
    config: LoadedConfig
    role: Role = Role.ALL
    replica_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    http_port: int | None = None
    # Called with (host, port) once HTTP serves (`claimd dev` prints its banner).
    on_http: Callable[[str, int], None] | None = None
    # The ports; None: PostgreSQL and NATS as the settings name them.
    bundle: PortBundle | None = None
    # The environment the config was read with, for each reload (None: the
    # process's). `claimd dev` names its embedded servers' URLs in it.
    config_env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.ports: PortBundle = self.bundle if self.bundle is not None else _production(self)
        self._jobs = JobsConfig(
            self.config_path, self.config, syncs_jobs=self.role.schedules, env=self.config_env
        )
        self.forced_stop = False
        # HTTP serves before the servers are connected (see run()).
        self.status = ReplicaStatus(self.ports.store_health, self.ports.broker_health)
        self.cluster_metrics = self.status.cluster_metrics
        self._api: OperatorApi | None = None

    @property
    def jobs(self) -> dict[str, Job]:
        return self._jobs.jobs

    async def reload(
        self, store: ReplicaStore, *, force: bool = False, trigger: str = "sighup"
    ) -> bool:
        """Reread the config file; a file with any error changes nothing.

        ``force``: the operator's rollback (SIGUSR1, `claimd reload --force`):
        applied even when older than the config generation in force.
        """
        ok = await self._jobs.reload(store, self.replica_id, force=force, trigger=trigger)
        self.config = self._jobs.loaded
        return ok

    async def run(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop_requested``), then stop cleanly.

        The stop is bounded: if in-flight work has not settled within the
        shutdown grace plus a margin (say the database is down and completions
        cannot be recorded), everything is cancelled; the leases recover what
        was left. A second signal forces the stop at once. And whatever the
        network does (a cancelled task still waiting on a silent connection,
        say), a signalled process exits within :func:`stop_bound`: a watchdog
        thread, armed by the signal, ends it then.

        HTTP starts first, before PostgreSQL and NATS are connected: /healthz
        and /metrics answer during an outage at start (the replica waits for
        its servers), and /readyz says which one is missing.
        """
        init_series()
        # Decided once, at start: a switch drops what the histograms observed.
        per_job_histograms(self.config.settings.histograms_by_job(len(self.jobs)))
        init_job_series(self.jobs)
        runner = await self._serve_http()
        main = asyncio.create_task(self._run())
        grace = self.config.settings.shutdown_grace.total_seconds()

        def on_signal() -> None:
            if self.stop_requested.is_set():
                log.warning("second signal: stopping now")
                self.forced_stop = True
                main.cancel()
            else:
                arm_exit_watchdog(stop_bound(grace))
            self.stop_requested.set()

        # Installed first: a signal during start-up stops the replica cleanly too.
        on_signals(STOP_SIGNALS, on_signal)
        stop = asyncio.create_task(self.stop_requested.wait())
        try:
            await asyncio.wait({main, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not main.done():
                deadline = grace + STOP_MARGIN_S
                _, pending = await asyncio.wait({main}, timeout=deadline)
                if pending:
                    log.error(
                        "stop did not finish in time; cancelling what is left "
                        "(leases will recover it)",
                        waited_s=deadline,
                    )
                    self.forced_stop = True
                    await cancel_within(main, EXIT_MARGIN_S)
            if main.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await main
        finally:
            stop.cancel()
            off_signals(STOP_SIGNALS)
            if runner is not None:
                # An HTTP request still open (a scrape waiting on a silent
                # server) must not hold the exit either.
                try:
                    await asyncio.wait_for(runner.cleanup(), EXIT_MARGIN_S)
                except TimeoutError:
                    log.warning(
                        "http server did not close in time; abandoned", waited_s=EXIT_MARGIN_S
                    )

    async def _serve_http(self) -> Any:
        settings = self.config.settings
        if settings.http_port < 0:
            return None
        # The operator API answers 503 until PostgreSQL is connected (see _run).
        self._api = OperatorApi(
            cast(OperatorService, _UntilConnected()),
            settings.api_tokens,
            metrics_token=settings.metrics_token,
        )
        # Live output (GET /api/runs/{id}/output/stream): followed through the ports, on
        # at most a quarter of the connection cap.
        self._api.output_feed = self.ports.output_feed()
        self._api.max_output_streams = max(
            1, min(MAX_STREAMS, connection_cap(settings.http_max_connections) // 4)
        )
        guard = Guard(
            tokens=self._api.tokens,
            allowed_hosts=frozenset(settings.allowed_hosts),
            metrics_token=settings.metrics_token,
            max_connections=settings.http_max_connections,
            header_timeout_s=settings.http_header_timeout.total_seconds(),
            body_timeout_s=settings.http_body_timeout.total_seconds(),
        )
        status = self.status
        app = build_app(
            status.ready,
            self._api,
            refresh=status.refresh_metrics,
            guard=guard,
        )
        runner, self.http_port = await serve(app, settings.http_host, settings.http_port, guard)
        log.info(
            "http serving",
            http=f"{settings.http_host}:{self.http_port}",
            reads="token" if guard.tokens.configured else "open",
        )
        if self.on_http is not None:
            self.on_http(settings.http_host, self.http_port)
        return runner

    async def _run(self) -> None:
        store = await until_connected(
            self.stop_requested, "PostgreSQL", self.ports.open_store, self.ports.store_unreachable
        )
        if store is None:
            return
        self.status.connected(store)
        service = await self.ports.open_operator(store) if self._api is not None else None
        if self._api is not None and service is not None:
            self._api.service = service
            # GET /api/notifications reads the outbox (a bounded page, on the replica's pool).
            outbox = self.ports.notifications(store)
            self._api.outbox = outbox[0] if outbox is not None else None
        try:
            await self._run_with(store)
        finally:
            self.status.connected(None)
            if self._api is not None:
                self._api.service = cast(OperatorService, _UntilConnected())
                self._api.outbox = None
            if service is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(service.history.close(), EXIT_MARGIN_S)
            await store.close()

    async def _run_with(self, store: ReplicaStore) -> None:
        # A database that times out or goes away during the first sync (100,000
        # jobs written under load) is waited out as at connect, not a failed start.
        synced = await until_connected(
            self.stop_requested,
            "PostgreSQL (syncing the jobs)",
            lambda: self._jobs.sync_at_start(store, self.replica_id),
            lambda exc: isinstance(exc, Outage),
        )
        if synced is None:
            return
        # Whatever fails while connecting to NATS is worth waiting out (an
        # authorization error too is logged with every retry).
        broker = await until_connected(
            self.stop_requested, "NATS", self.ports.open_broker, lambda _: True
        )
        if broker is None:
            return
        try:
            await self.ports.prepare_broker(broker)
            # Ready (/readyz) from here: migrated, synced, the stream prepared.
            self.status.broker = broker
            await self._run_actors(ReplicaPorts(store, broker, self.ports))
        finally:
            self.status.broker = None
            await broker.close()

    async def _run_actors(self, ports: ReplicaPorts) -> None:
        settings = self.config.settings
        reload_tasks: set[asyncio.Task[bool]] = set()

        def reload_done(task: asyncio.Task[bool]) -> None:
            reload_tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("reload failed", error=repr(task.exception()))

        def start_reload(force: bool, trigger: str) -> None:
            task = asyncio.ensure_future(self.reload(ports.store, force=force, trigger=trigger))
            reload_tasks.add(task)
            task.add_done_callback(reload_done)

        on_signals((signal.SIGHUP,), lambda: start_reload(False, "sighup"))
        on_signals((signal.SIGUSR1,), lambda: start_reload(True, "forced"))
        watch = ConfigWatch(
            self._jobs,
            self.replica_id,
            settings.config_poll,
            lambda: self.reload(ports.store, trigger="file changed"),
        )
        watching = asyncio.create_task(watch.run(ports.store, self.stop_requested))
        log.info(
            "replica started",
            replica=self.replica_id,
            role=self.role.value,
            http=(f"{settings.http_host}:{self.http_port}" if settings.http_port >= 0 else "off"),
            jobs=len(self.jobs),
            database=redact(settings.database_url),
            nats=redact(settings.nats_url),
        )
        try:
            await run_actors(
                ports,
                settings,
                self.role,
                self.replica_id,
                self.stop_requested,
                config_jobs=lambda: self._jobs.jobs,
                notify_config=lambda: self._jobs.loaded.notify,
            )
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            with contextlib.suppress(Exception):  # its report expires anyway
                await asyncio.wait_for(ports.store.forget_config_replica(self.replica_id), 2)
        log.info("replica stopped", replica=self.replica_id)

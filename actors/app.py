"""One claimd replica: wires adapters to actors for a role and runs them supervised."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import math
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from actors.adapters.executors import LocalExecutor
from actors.adapters.history import Actor, record_action
from actors.adapters.nats import NATS_HEALTH, JetStreamBroker
from actors.adapters.nats_inbox import PROBE_TIMEOUT_S, JetStreamInbox, PullSubscription
from actors.adapters.postgres import POSTGRES_HEALTH, PostgresRunStore, is_unreachable
from actors.api import OperatorApi
from actors.claimer import Claimer
from actors.clock import DatabaseClock
from actors.cluster_metrics import ClusterMetrics
from actors.compensator import Compensator
from actors.config import ConfigError, ConfigErrors, LoadedConfig, load_config
from actors.dispatcher import Dispatcher
from actors.domain import ClaimedRun, Job
from actors.flow import Backoff, BrokerGate, ClaimedBatch, Probe
from actors.http import build_app, serve
from actors.materializer import Materializer
from actors.observability import (
    CONFIG_JOB_ERRORS,
    get_logger,
    init_job_series,
    init_series,
    redact,
)
from actors.operator import OperatorService, Unavailable
from actors.ports import Outage
from actors.reaper import Reaper
from actors.supervisor import supervise
from actors.testing.faults import install_store_faults, install_worker_faults
from actors.worker import Worker, WorkerSettings

log = get_logger("replica")

JOBS_SUMMARY = """
SELECT j.name, j.enabled, j.paused,
       (SELECT count(*) FROM job_runs r WHERE r.job_id = j.id AND r.state = 'pending') AS pending,
       (SELECT max(r.finished_at) FROM job_runs r
         WHERE r.job_id = j.id AND r.state = 'succeeded') AS last_success
  FROM jobs j ORDER BY j.name
"""


# How long past the shutdown grace a stop may take before it is forced
# (everything left is cancelled; the leases recover it).
STOP_MARGIN_S = 15.0
# How long after that the process may still take to wind down (closing
# connections, cancelled tasks that wait on a silent link) before it exits
# at once, whatever it is waiting for.
EXIT_MARGIN_S = 5.0
# Forced exit's status (the stop did not finish cleanly; same as a forced stop).
FORCED_EXIT_CODE = 1
# /readyz: each dependency must answer a round trip within this long.
READY_TIMEOUT_S = 2.0

T = TypeVar("T")


def stop_bound(grace: float) -> float:
    """Seconds from SIGTERM to the end of the process, at most: the promise."""
    return grace + STOP_MARGIN_S + EXIT_MARGIN_S


class _UntilConnected:
    """The operator service's stand-in until PostgreSQL is connected: every call is a 503."""

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def unavailable(*_: Any, **__: Any) -> Any:
            raise Unavailable("not connected to PostgreSQL yet; try again")

        return unavailable


class Role(enum.StrEnum):
    ALL = "all"
    SCHEDULER = "scheduler"
    WORKER = "worker"


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

    def __post_init__(self) -> None:
        self.jobs: dict[str, Job] = dict(self.config.jobs)
        self.forced_stop = False
        self._reloading = asyncio.Lock()
        # Set while connected; HTTP serves before either is (see run()).
        self._store: PostgresRunStore | None = None
        self._broker: JetStreamBroker | None = None
        self._api: OperatorApi | None = None
        self._probed_at = float("-inf")
        self.cluster_metrics = ClusterMetrics()

    async def reload(self, store: PostgresRunStore) -> bool:
        """Reread the config file; a file with any error changes nothing."""
        async with self._reloading:  # two SIGHUPs in a row reload one after the other
            ok = await self._reload(store)
        try:  # the record `claimd reload` waits for; a reload never fails for want of it
            await record_action(
                store.pool,
                Actor("sighup", "signal", self.replica_id),
                "reload",
                arguments={"pid": os.getpid(), "path": str(self.config_path)},
                ok=ok,
                result="reloaded" if ok else "refused: the file has errors; jobs unchanged",
            )
        except Exception as exc:  # noqa: BLE001
            log.warning("reload not recorded", error=redact(repr(exc)))
        return ok

    async def _reload(self, store: PostgresRunStore) -> bool:
        try:
            loaded = load_config(self.config_path)
            loaded.raise_for_errors()
        except (ConfigError, ConfigErrors) as exc:
            log.error(
                "reload rejected; running jobs unchanged",
                path=str(self.config_path),
                errors=str(exc),
            )
            return False
        # Materializers plan from the stored definitions, and write only while a
        # plan's definition is still the stored one: a tick racing this sync, here
        # or on another replica, cannot write the old schedule's instants.
        changes = (
            await store.sync_jobs(list(loaded.jobs.values()))
            if self.role in (Role.ALL, Role.SCHEDULER)
            else {}
        )
        if loaded.settings != self.config.settings:
            log.warning(
                "reload applies jobs only; changed [claimd] settings take effect "
                "at the next restart",
                path=str(self.config_path),
            )
        self.jobs = dict(loaded.jobs)
        init_job_series(self.jobs)
        self.config = dataclasses.replace(loaded, settings=self.config.settings)
        CONFIG_JOB_ERRORS.set(0)
        log.info("reloaded", path=str(self.config_path), changes=changes)
        return True

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
        init_job_series(self.jobs)
        runner = await self._serve_http()
        main = asyncio.create_task(self._run())
        loop = asyncio.get_running_loop()
        grace = self.config.settings.shutdown_grace.total_seconds()

        def on_signal() -> None:
            if self.stop_requested.is_set():
                log.warning("second signal: stopping now")
                self.forced_stop = True
                main.cancel()
            else:
                _arm_exit_watchdog(stop_bound(grace))
            self.stop_requested.set()

        # Installed first: a signal during start-up stops the replica cleanly too.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
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
                    await _cancel_within(main, EXIT_MARGIN_S)
            if main.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await main
        finally:
            stop.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
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
        self._api = OperatorApi(cast(OperatorService, _UntilConnected()), settings.api_tokens)
        runner, self.http_port = await serve(
            build_app(self._ready, self._jobs_summary, self._api, refresh=self._refresh_metrics),
            settings.http_host,
            settings.http_port,
        )
        log.info("http serving", http=f"{settings.http_host}:{self.http_port}")
        if self.on_http is not None:
            self.on_http(settings.http_host, self.http_port)
        return runner

    async def _refresh_metrics(self) -> None:
        """Before a scrape: the cluster gauges, and a round trip to each server (at most
        once a second) so that ``claimd_dependency_up`` is as fresh as the scrape."""
        now = asyncio.get_running_loop().time()
        probe = now - self._probed_at >= 1.0
        if probe:
            self._probed_at = now
        await asyncio.gather(
            self.cluster_metrics.refresh(), self._ready() if probe else asyncio.sleep(0)
        )

    async def _ready(self) -> dict[str, Any]:
        """A real round trip to each server, with a deadline: a frozen server fails it.

        The verdicts also set ``claimd_dependency_up``: a server that holds the
        connection open and answers nothing is down, though no call has failed.
        """

        async def postgres() -> str:
            if self._store is None:
                return "not connected"
            await self._store.ping()
            return "ok"

        async def nats() -> str:
            if self._broker is None:
                return "not connected"
            if not self._broker.nc.is_connected:
                return "disconnected"
            # PING, wait for the PONG (the outer deadline is what bounds it)
            await self._broker.nc.flush(timeout=math.ceil(READY_TIMEOUT_S))
            return "ok"

        async def check(probe: Callable[[], Awaitable[str]]) -> str:
            try:
                return await asyncio.wait_for(probe(), READY_TIMEOUT_S)
            except TimeoutError:
                return f"no answer within {READY_TIMEOUT_S:g}s"
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                return redact(repr(exc))[:300]

        pg, nc = await asyncio.gather(check(postgres), check(nats))
        for health, verdict in ((POSTGRES_HEALTH, pg), (NATS_HEALTH, nc)):
            if verdict == "ok":
                health.reached()
            elif verdict.startswith("no answer within"):
                health.lost(f"/readyz round trip: {verdict}")
        return {"postgres": pg, "nats": nc}

    async def _jobs_summary(self) -> list[dict[str, Any]]:
        if self._store is None:
            raise ConnectionError("not connected to PostgreSQL yet")
        rows = await self._store.pool.fetch(JOBS_SUMMARY)
        return [json.loads(json.dumps(dict(r), default=str)) for r in rows]

    async def _until_connected(
        self,
        what: str,
        connect: Callable[[], Coroutine[Any, Any, T]],
        transient: Callable[[BaseException], bool],
    ) -> T | None:
        """Connect, waiting out an unreachable server; None if a stop comes first.

        An error that is not about reaching the server (a refused password, say)
        is raised: waiting would not fix it.
        """
        backoff = Backoff(initial=0.5, maximum=5.0)
        while not self.stop_requested.is_set():
            attempt = asyncio.create_task(connect())
            stop = asyncio.create_task(self.stop_requested.wait())
            await asyncio.wait({attempt, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await attempt
                return None
            exc = attempt.exception()
            if exc is None:
                return attempt.result()
            if not transient(exc):
                raise exc
            delay = backoff.next_delay()
            log.warning(
                f"{what} unreachable; waiting for it",
                error=redact(repr(exc))[:300],
                retry_in_s=round(delay, 3),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_requested.wait(), delay)
        return None

    async def _open_store(self) -> PostgresRunStore:
        settings = self.config.settings
        store = install_store_faults(
            await PostgresRunStore.connect(
                settings.database_url,
                max_size=min(20, 4 + settings.worker_concurrency),
                timeouts=settings.timeouts,
            )
        )
        try:
            applied = await store.migrate()
        except BaseException:
            await store.close()
            raise
        if applied:
            log.info("migrated", applied=applied)
        return store

    async def _run(self) -> None:
        store = await self._until_connected(
            "PostgreSQL",
            self._open_store,
            lambda exc: isinstance(exc, Outage) or is_unreachable(exc),
        )
        if store is None:
            return
        self._store = store
        self.cluster_metrics.read = store.cluster_figures
        if self._api is not None:
            self._api.service = OperatorService(store.pool)
        try:
            await self._run_with(store)
        finally:
            self.cluster_metrics.read = None
            self._store = None
            if self._api is not None:
                self._api.service = cast(OperatorService, _UntilConnected())
            await store.close()

    async def _run_with(self, store: PostgresRunStore) -> None:
        settings = self.config.settings
        for error in self.config.errors:
            log.error(
                "invalid job skipped; the others run",
                path=error.path,
                job=error.job,
                field=error.field_name,
                error=error.message,
            )
        CONFIG_JOB_ERRORS.set(len(self.config.errors))
        if self.role in (Role.ALL, Role.SCHEDULER):
            changes = await store.sync_jobs(
                list(self.jobs.values()), keep=[e.job for e in self.config.errors if e.job]
            )
            log.info("jobs synced", jobs=len(self.jobs), changes=changes)

        async def connect_broker() -> JetStreamBroker:
            return await JetStreamBroker.connect(
                settings.nats_servers,
                settings.stream,
                settings.subject,
                name=self.replica_id,
                tls_ca=settings.nats_tls_ca,
                timeouts=settings.timeouts,
            )

        # Whatever fails while connecting to NATS is worth waiting out (an
        # authorization error too is logged with every retry).
        broker = await self._until_connected("NATS", connect_broker, lambda _: True)
        if broker is None:
            return
        self._broker = broker
        try:
            await self._ensure_channel(broker)
            await self._run_actors(store, broker)
        finally:
            self._broker = None
            await broker.close()

    async def _ensure_channel(self, broker: JetStreamBroker) -> None:
        """The stream and the durable consumer, created or updated (idempotent)."""
        settings = self.config.settings
        await broker.ensure_stream(
            settings.duplicate_window,
            max_age=max(settings.lease * 2, settings.duplicate_window),
            replicas=settings.stream_replicas,
        )
        await broker.ensure_consumer(
            settings.ack_wait,
            settings.max_deliver,
            max_ack_pending=max(10_000, settings.max_claimed * 2),
        )

    async def _run_actors(self, store: PostgresRunStore, broker: JetStreamBroker) -> None:
        settings = self.config.settings
        loop = asyncio.get_running_loop()
        reload_tasks: set[asyncio.Task[bool]] = set()

        def reload_done(task: asyncio.Task[bool]) -> None:
            reload_tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("reload failed", error=repr(task.exception()))

        def on_hup() -> None:
            task = asyncio.ensure_future(self.reload(store))
            reload_tasks.add(task)
            task.add_done_callback(reload_done)

        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, on_hup)

        log.info(
            "replica started",
            replica=self.replica_id,
            role=self.role.value,
            http=(f"{settings.http_host}:{self.http_port}" if settings.http_port >= 0 else "off"),
            jobs=len(self.jobs),
            database=redact(settings.database_url),
            nats=redact(settings.nats_url),
        )
        await self._supervise_actors(store, broker)
        log.info("replica stopped", replica=self.replica_id)

    async def _supervise_actors(self, store: PostgresRunStore, broker: JetStreamBroker) -> None:
        settings = self.config.settings
        stop_claiming = asyncio.Event()
        stop_working = asyncio.Event()
        # A round trip to the broker within the deadline of a publish: what
        # reopens claiming (and the worker's fetching) after the broker failed.
        probe_timeout = broker.publish_timeout

        async def probe_broker() -> None:
            await broker.probe(probe_timeout)

        gate = BrokerGate(probe=Probe(probe_broker, probe_timeout))
        to_dispatch: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue(maxsize=4)
        to_release: asyncio.Queue[tuple[ClaimedRun, ...] | None] = asyncio.Queue(maxsize=64)
        scheduling = self.role in (Role.ALL, Role.SCHEDULER)
        working = self.role in (Role.ALL, Role.WORKER)

        # One clock, the database's: the materializer reads it every tick (and
        # so measures this replica's skew); the worker's lag metrics use it.
        clock = DatabaseClock(store)

        async with asyncio.TaskGroup() as group:
            tasks: dict[str, asyncio.Task[None]] = {}
            if scheduling:
                materializer = Materializer(
                    store, clock, settings.horizon, settings.materialize_interval, stop_claiming
                )
                claimer = Claimer(
                    store,
                    self.replica_id,
                    to_dispatch,
                    gate,
                    batch=settings.claim_batch,
                    lease=settings.lease,
                    max_claimed=settings.max_claimed,
                    interval=settings.claim_interval,
                    stop=stop_claiming,
                )
                dispatcher = Dispatcher(broker, settings.deployment, to_dispatch, to_release, gate)
                compensator = Compensator(store, self.replica_id, to_release)
                reaper = Reaper(
                    store,
                    settings.reap_interval,
                    stop_claiming,
                    retention=settings.history_retention,
                )
                for name, start in (
                    ("materializer", materializer.run),
                    ("claimer", claimer.run),
                    ("dispatcher", dispatcher.run),
                    ("compensator", compensator.run),
                    ("reaper", reaper.run),
                ):
                    tasks[name] = group.create_task(supervise(name, start), name=name)
            if working:

                async def resubscribe() -> PullSubscription:
                    await self._ensure_channel(broker)
                    return await broker.pull_subscription()

                worker_settings = WorkerSettings.from_config(settings, self.replica_id)
                inbox = JetStreamInbox(
                    await broker.pull_subscription(),
                    settings.deployment,
                    rebind=resubscribe,
                    probe=probe_broker,
                    probe_timeout=min(
                        PROBE_TIMEOUT_S, worker_settings.stall_threshold.total_seconds()
                    ),
                )
                worker = Worker(
                    install_worker_faults(store),
                    inbox,
                    LocalExecutor(),
                    worker_settings,
                    stop=stop_working,
                    clock=clock,
                )
                tasks["worker"] = group.create_task(supervise("worker", worker.run), name="worker")
            if not scheduling:
                # No materializer reads the database's clock here: measure the skew anyway.
                async def measure_skew() -> None:
                    await clock.run(stop_working, settings.materialize_interval)

                tasks["clock"] = group.create_task(supervise("clock", measure_skew), name="clock")

            await self.stop_requested.wait()
            log.info(
                "stopping: no new claims; finishing in-flight work",
                grace_s=settings.shutdown_grace.total_seconds(),
            )
            # Order matters: stop claiming, let the dispatcher publish or release
            # everything claimed; then the worker drains while the compensator
            # hands back what was not published.
            stop_claiming.set()
            if scheduling:
                await tasks["claimer"]
                await to_dispatch.put(None)
                await tasks["dispatcher"]
            stop_working.set()
            if scheduling:
                await _release_within(
                    tasks["compensator"], to_release, settings.shutdown_grace.total_seconds()
                )


async def _release_within(
    compensator: asyncio.Task[None],
    inbox: asyncio.Queue[tuple[ClaimedRun, ...] | None],
    seconds: float,
) -> None:
    """The compensator's last releases, while the database takes them within ``seconds``.

    It retries an outage for as long as it lasts; at a stop, the runs it could
    not hand back in time are left to their claim leases instead.
    """
    try:
        async with asyncio.timeout(seconds):
            await inbox.put(None)
            await compensator  # cancelled with this wait when the time is up
    except TimeoutError:
        log.warning(
            "stopping: unpublished runs not all released in time; their claim "
            "leases bring them back",
            waited_s=seconds,
        )


async def _cancel_within(task: asyncio.Task[None], seconds: float) -> None:
    """Cancel ``task`` and wait for it at most ``seconds``, cancelling again halfway.

    A cancelled task may go on waiting in its cleanup (a pool close on a silent
    connection, say) until cancelled once more. Still not done after that, it
    is left: the replica returns, and the exit watchdog ends the process.
    """
    task.cancel()
    _, pending = await asyncio.wait({task}, timeout=seconds / 2)
    if pending:
        task.cancel()
        _, pending = await asyncio.wait({task}, timeout=seconds / 2)
    if pending:
        log.error(
            "stop still waiting after cancelling; leaving it", waited_s=STOP_MARGIN_S + seconds
        )


_watchdog: threading.Timer | None = None


def _arm_exit_watchdog(seconds: float) -> None:
    """End the process ``seconds`` from now unless it has ended by then (once per process).

    A daemon thread: it does not keep a process that ends in time alive, and
    it fires even while the event loop is stuck.
    """
    global _watchdog
    if _watchdog is not None:
        return

    def exit_now() -> None:
        log.error(
            "stop exceeded its bound; exiting now (leases recover the runs left)", bound_s=seconds
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(FORCED_EXIT_CODE)

    _watchdog = threading.Timer(seconds, exit_now)
    _watchdog.daemon = True
    _watchdog.start()

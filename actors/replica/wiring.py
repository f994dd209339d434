"""The actor set of one replica, wired to its ports and supervised, with the stop's order.

Given a store, a broker and the rest of its ports (``PortBundle``), whatever
they are built on, :func:`run_actors` starts the actors of the replica's
role, each under the supervisor, waits for the stop, and stops them in the
order that loses nothing: claiming first, then publishing or releasing
everything claimed, then the worker's drain beside the last releases.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from actors.config import Settings
from actors.config.notify import NotifyConfig
from actors.domain import ClaimedRun, Job
from actors.observability import get_logger
from actors.pacing import BrokerGate, ClaimedBatch, Probe
from actors.ports import Closing, ReplicaBroker, ReplicaStore
from actors.replica.lifecycle import release_within
from actors.replica.port_bundle import PortBundle
from actors.scheduling.claimer import Claimer
from actors.scheduling.compensator import Compensator
from actors.scheduling.dispatcher import Dispatcher
from actors.scheduling.materializer import Materializer
from actors.scheduling.notifier import Notifier
from actors.scheduling.reaper import Reaper
from actors.scheduling.runtime import Runtime
from actors.scheduling.supervisor import supervise
from actors.worker import Worker, WorkerSettings

log = get_logger("replica")

# Claimed batches on their way to the dispatcher: a few, so a claim waits for
# the dispatcher rather than holding leases that only wait in a queue.
DISPATCH_QUEUE = 4
# Unpublished runs on their way back to pending.
RELEASE_QUEUE = 64


class Role(enum.StrEnum):
    ALL = "all"
    SCHEDULER = "scheduler"
    WORKER = "worker"

    @property
    def schedules(self) -> bool:
        """Materializes, claims, dispatches, compensates and reaps."""
        return self in (Role.ALL, Role.SCHEDULER)

    @property
    def works(self) -> bool:
        """Executes dispatched runs."""
        return self in (Role.ALL, Role.WORKER)


@dataclass(frozen=True)
class ReplicaPorts:
    """What the actors of one replica speak to, once connected."""

    store: ReplicaStore
    broker: ReplicaBroker
    bundle: PortBundle


async def run_actors(
    ports: ReplicaPorts,
    settings: Settings,
    role: Role,
    replica_id: str,
    stop_requested: asyncio.Event,
    config_jobs: Callable[[], Mapping[str, Job]] = dict,
    notify_config: Callable[[], NotifyConfig] = NotifyConfig,
) -> None:
    """Run the role's actors until ``stop_requested``, then stop them in order.

    ``config_jobs``: the replica's jobs as its config has them now (the
    materializer uses one in place of a stored definition that is the same);
    ``notify_config``: its ``[notify]`` table and the jobs' notification keys now.
    """
    store, broker, bundle = ports.store, ports.broker, ports.bundle
    stop_claiming = asyncio.Event()
    stop_working = asyncio.Event()
    # A round trip to the broker within the deadline of a publish: what
    # reopens claiming (and the worker's fetching) after the broker failed.
    probe_timeout = broker.publish_timeout

    async def probe_broker() -> None:
        await broker.probe(probe_timeout)

    gate = BrokerGate(probe=Probe(probe_broker, probe_timeout))
    to_dispatch: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue(maxsize=DISPATCH_QUEUE)
    to_release: asyncio.Queue[tuple[ClaimedRun, ...] | None] = asyncio.Queue(maxsize=RELEASE_QUEUE)

    # One clock, the database's: the materializer reads it every tick (and
    # so measures this replica's skew); the worker's lag metrics use it.
    clock = bundle.database_clock(store)
    # What every scheduling actor is handed: that clock, the local timers' and its logger.
    runtime = Runtime(clock)

    async with asyncio.TaskGroup() as group:
        tasks: dict[str, asyncio.Task[None]] = {}
        if role.schedules:
            materializer = Materializer(
                store,
                clock,
                settings.horizon,
                settings.materialize_interval,
                stop_claiming,
                # Ticks keep out of a herd's seconds: from its claim-ahead on.
                quiet_before=settings.effective_claim_ahead + timedelta(seconds=2),
                config_jobs=config_jobs,
                runtime=runtime,
            )
            claimer = Claimer(
                store,
                replica_id,
                to_dispatch,
                gate,
                batch=settings.claim_batch,
                lease=settings.lease,
                max_claimed=settings.max_claimed,
                interval=settings.claim_interval,
                stop=stop_claiming,
                ahead=settings.effective_claim_ahead,
                wake=settings.claim_wake,
                runtime=runtime,
            )
            dispatcher = Dispatcher(
                broker, settings.deployment, to_dispatch, to_release, gate, runtime=runtime
            )
            compensator = Compensator(store, replica_id, to_release, runtime=runtime)
            reaper = Reaper(
                store,
                settings.reap_interval,
                stop_claiming,
                retention=settings.history_retention,
                runtime=runtime,
            )
            for name, start in (
                ("materializer", materializer.run),
                ("claimer", claimer.run),
                ("dispatcher", dispatcher.run),
                ("compensator", compensator.run),
                ("reaper", reaper.run),
            ):
                tasks[name] = group.create_task(supervise(name, start), name=name)
            listen = bundle.pending_listener(store, claimer.run_pending)
            if settings.claim_wake and listen is not None:

                async def listener() -> None:
                    assert listen is not None
                    await listen(stop_claiming)

                tasks["listener"] = group.create_task(supervise("listener", listener))
        if role.works:
            worker_settings = WorkerSettings.from_config(settings, replica_id)
            inbox = await bundle.worker_inbox(broker, probe_broker, worker_settings.stall_threshold)
            executor = bundle.executor()
            worker = Worker(
                bundle.worker_store(store),
                inbox,
                executor,
                worker_settings,
                stop=stop_working,
                clock=clock,
            )
            tasks["worker"] = group.create_task(_work(worker, executor), name="worker")
        notifications = bundle.notifications(store)
        if notifications is not None:
            # Every role sends: the outbox is claimed like runs, whoever claims.
            notifier = Notifier(
                *notifications,
                replica_id,
                lambda: (notify_config(), config_jobs()),
                stop_claiming,
            )
            tasks["notifier"] = group.create_task(
                supervise("notifier", notifier.run), name="notifier"
            )
        if not role.schedules:
            # No materializer reads the database's clock here: measure the skew anyway.
            async def measure_skew() -> None:
                await clock.run(stop_working, settings.materialize_interval)

            tasks["clock"] = group.create_task(supervise("clock", measure_skew), name="clock")

        await stop_requested.wait()
        log.info(
            "stopping: no new claims; finishing in-flight work",
            grace_s=settings.shutdown_grace.total_seconds(),
        )
        # Order matters: stop claiming, let the dispatcher publish or release
        # everything claimed; then the worker drains while the compensator
        # hands back what was not published.
        stop_claiming.set()
        if role.schedules:
            await tasks["claimer"]
            await to_dispatch.put(None)
            await tasks["dispatcher"]
        stop_working.set()
        if role.schedules:
            await release_within(
                tasks["compensator"], to_release, settings.shutdown_grace.total_seconds()
            )


async def _work(worker: Worker, executor: object) -> None:
    """The worker under its supervisor, then its executor closed.

    The python fork server and its warm children end with the worker, not when
    the loop is torn down (they were noticed gone then: a warning at every stop).
    """
    try:
        await supervise("worker", worker.run)
    finally:
        if isinstance(executor, Closing):
            await asyncio.shield(executor.close())

"""Starting: a fetched batch becomes runs executing here, in one statement.

The start path is :meth:`Starter.start`: the deliveries (decoded by the
inbox) -> ``start_runs`` -> one execution spawned per started run; what cannot
start is settled here. Runs claimed ahead wait until their instant first
(actors/until_due.py): :meth:`Starter.run_until_due` starts them then.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any

from actors.observability import DELIVERIES_SKIPPED, REDELIVERIES, get_logger
from actors.ports import Delivery, DispatchMessage, Outage, RunStore, StartedRun
from actors.until_due import UntilDue
from actors.worker.heartbeat import STARTS, InFlight, Keeping
from actors.worker.holding import Holding, Key, quietly
from actors.worker.settings import WorkerSettings

log = get_logger("worker")
START_UNKNOWN_KEPT = 10_000  # (run, epoch) keys whose start reply was lost, remembered

Execute = Callable[[StartedRun, InFlight], Coroutine[Any, Any, None]]


class Starter:
    def __init__(
        self,
        store: RunStore,
        settings: WorkerSettings,
        holding: Holding,
        keeping: Keeping,
        execute: Execute,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """``clock``: the database's time as this worker estimates it (DatabaseClock.now)."""
        self.store = store
        self.settings = settings
        self.holding = holding
        self.keeping = keeping
        self.execute = execute
        # Attempts whose start may have committed without the reply reaching us
        # (start_runs raised or was cancelled): never begun here, so their redelivery may take up
        # again a run left `running` under this worker and epoch. Nothing else
        # may: an attempt this worker began (and whose actor then crashed, or
        # whose completion could not be recorded) is left to its lease, never
        # run twice under one fencing token. Kept across restarts of the actor
        # (the supervisor reruns the same worker, with the same worker id).
        self.start_unknown: OrderedDict[Key, None] = OrderedDict()
        # Runs claimed ahead wait here until their instant.
        self.until_due: UntilDue[Delivery] = UntilDue(
            clock or (lambda: datetime.now(UTC)), settings.max_hold
        )
        self._releasing = asyncio.Lock()  # run_until_due's own (it alone releases held runs)

    async def start(self, deliveries: Sequence[Delivery], group: asyncio.TaskGroup) -> None:
        """Start in one statement, spawn executions; settle what cannot start."""
        batch: list[tuple[DispatchMessage, Delivery]] = []
        keys: list[Key] = []
        starting = self.holding.starting
        try:
            for delivery in deliveries:
                message = delivery.message
                key = (message.run_id, message.epoch)
                if delivery.delivery_count > 1:
                    REDELIVERIES.inc()
                if key in self.holding.in_flight:
                    # Executing here already (the broker redelivered while it ran):
                    # settle this copy; the running one records and acks.
                    DELIVERIES_SKIPPED.labels(reason="executing_here").inc()
                    await quietly(delivery.ack())
                    continue
                if key in starting:
                    # In a start here still waiting for its reply (another
                    # batch's, or this one's): that copy is settled with it;
                    # this one comes back later and finds the run executing
                    # here, or settled.
                    DELIVERIES_SKIPPED.labels(reason="starting_here").inc()
                    await quietly(delivery.nak(delay=1.0))
                    continue
                starting.add(key)  # before any await: no other start takes it meanwhile
                keys.append(key)
                batch.append((message, delivery))
            # Runs claimed ahead wait until their instant (actors/until_due.py);
            # the due ones start now, in this batch's own slots.
            batch = self.until_due.split(batch, room=len(batch))
            if not batch:
                return
            await self._start(batch, [(m.run_id, m.epoch) for m, _ in batch], group)
        finally:
            starting.difference_update(keys)

    async def _start(
        self,
        batch: list[tuple[DispatchMessage, Delivery]],
        keys: list[Key],
        group: asyncio.TaskGroup,
    ) -> None:
        retake = {k for k in keys if k in self.start_unknown}
        # Until its reply is in hand, a start may commit unseen (the connection
        # drops, or this task is cancelled while it waits): remembered first.
        self._remember_start_unknown(keys)
        try:
            with self.keeping.call(STARTS):
                started, not_started = await self.store.start_runs(
                    self.settings.worker_id,
                    [m for m, _ in batch],
                    self.settings.lease,
                    retake=retake,
                )
        except Exception as exc:
            # Nothing began here: the broker redelivers, and these runs may be
            # taken up again then. An outage is waited out here (no fetch until
            # the database answers); anything else is a bug the supervisor must see.
            for _, delivery in batch:
                await quietly(delivery.nak(delay=1.0))
            if not isinstance(exc, Outage):
                raise
            self.keeping.failed(STARTS, repr(exc)[:200])
            log.warning(
                "start failed; messages will be redelivered", error=repr(exc), runs=len(batch)
            )
            return
        self.keeping.succeeded(STARTS)
        by_key = {(m.run_id, m.epoch): d for m, d in batch}
        # The started runs enter the in-flight set before anything else is
        # awaited: from here on they are begun, never to be taken up again.
        for run in started:
            entry = InFlight(run.run_id, run.epoch, run.job, by_key[(run.run_id, run.epoch)])
            self.holding.hold(entry)
            entry.task = group.create_task(self.execute(run, entry))
            self.holding.executing(entry.task)
        for key in keys:
            self.start_unknown.pop(key, None)  # answered: started now, or never will be
        for skipped in not_started:
            if skipped.reason == "early":
                # Not yet due on the database's clock (this worker's estimate ran fast).
                key = (skipped.run_id, skipped.epoch)
                message = next(m for m, _ in batch if (m.run_id, m.epoch) == key)
                self.until_due.again(message, by_key[key])
                continue
            DELIVERIES_SKIPPED.labels(reason=skipped.reason).inc()
            delivery = by_key[(skipped.run_id, skipped.epoch)]
            log.info(
                "delivery changed nothing",
                run_id=skipped.run_id,
                epoch=skipped.epoch,
                reason=skipped.reason,
                state=skipped.state,
            )
            # Unknown: not a run of this database (or a run claimed ahead and then
            # withdrawn by a schedule change); terminate so it is never redelivered.
            await quietly(delivery.term() if skipped.reason == "unknown" else delivery.ack())

    async def run_until_due(self, group: asyncio.TaskGroup) -> None:
        """Start held runs at their instants, within the free slots, until closed."""

        def free() -> int:
            # No slot while the worker could not keep what it starts (see Keeping):
            # the held runs wait, or are redelivered to a worker that can.
            if self.keeping.trouble() is not None:
                return 0
            return self.settings.concurrency - self.holding.busy

        async def start(batch: list[tuple[DispatchMessage, Delivery]]) -> None:
            # Their slots are taken before anything is awaited (free() counted
            # them), as the fetch loop takes a fetched batch's.
            keys = [(m.run_id, m.epoch) for m, _ in batch]
            self.holding.take(len(batch))
            self.holding.starting.update(keys)
            try:
                await self._start(batch, keys, group)
            finally:
                self.holding.starting.difference_update(keys)
                self.holding.give(len(batch))

        await self.until_due.run(start, free, self.holding.slot_freed, self._releasing)

    async def hand_back_held(self, until_due: asyncio.Task[None]) -> None:
        """At a stop: runs held, not started, go back to the broker at once for others."""
        self.until_due.close()
        await asyncio.wait([until_due])
        held = self.until_due.take_all()
        if held:
            log.info("stopping: held runs handed back unstarted", runs=len(held))
        for _, delivery in held:
            await quietly(delivery.nak())

    def _remember_start_unknown(self, keys: Sequence[Key]) -> None:
        for key in keys:
            self.start_unknown[key] = None
            self.start_unknown.move_to_end(key)
        while len(self.start_unknown) > START_UNKNOWN_KEPT:
            self.start_unknown.popitem(last=False)

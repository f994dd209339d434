"""Starting: a fetched batch becomes runs executing here, in one statement.

The start path is :meth:`Starter.start`: the deliveries (decoded by the
inbox) -> ``start_runs`` -> one execution spawned per started run; what cannot
start is settled here. Runs claimed ahead wait until their instant first
(actors/worker/claimed_ahead.py): :meth:`Starter.run_until_due` starts them then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from actors.domain import StartRefusal
from actors.observability import DELIVERIES_SKIPPED, REDELIVERIES, get_logger
from actors.ports import Delivery, DispatchMessage, Outage, StartedRun, WorkerStore, settle_quietly
from actors.worker.claimed_ahead import ClaimedAhead
from actors.worker.heartbeat import STARTS, InFlight, Keeping
from actors.worker.holding import Holding, Key
from actors.worker.settings import WorkerSettings

log = get_logger("worker")
START_UNKNOWN_KEPT = 10_000  # (run, epoch) keys whose start reply was lost, remembered
# Held runs started by one statement at most (an instant of 10,000 runs takes a
# few): each START_RUNS stays short, and executions begin between them.
START_BATCH = 1_000
# Starts of held runs under way at once, each a START_RUNS on a connection of
# its own: an instant's statements overlap instead of queueing behind each other.
HELD_STARTS_IN_FLIGHT = 4

Execute = Callable[[StartedRun, InFlight], Coroutine[Any, Any, None]]


class Taken:
    """What :meth:`Starter.take_in` took for one fetched batch, freed once by :meth:`finish`.

    ``finish`` runs when the start ends, and as the start task's done callback
    too: a task cancelled before it began (a crash of the worker's group)
    would otherwise keep its slots and its keys for good.
    """

    def __init__(self, starter: Starter) -> None:
        self.starter = starter
        self.batch: list[tuple[DispatchMessage, Delivery]] = []
        self.keys: list[Key] = []
        self.settle: list[Callable[[], Awaitable[None]]] = []
        self._finished = False

    def finish(self, _: object = None) -> None:
        if self._finished:
            return
        self._finished = True
        self.starter.holding.starting.difference_update(self.keys)
        self.starter.release(self.batch)


class Starter:
    def __init__(
        self,
        store: WorkerStore,
        settings: WorkerSettings,
        holding: Holding,
        keeping: Keeping,
        execute: Execute,
        clock: Callable[[], datetime] | None = None,
        runs_inline: Callable[[str | None], bool] | None = None,
        prepare: Callable[[str | None, int], None] | None = None,
    ) -> None:
        """``clock``: the database's time as this worker estimates it (DatabaseClock.now).

        ``runs_inline(hint)``: whether a run of that kind (the message's
        ``executor``) executes on the event loop, in the inline pool of slots.
        ``prepare(hint, count)``: ``count`` runs of that kind are coming (the executor
        forks a sync python job's warm processes while its runs are held, before the
        instant).
        """
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
        self.until_due: ClaimedAhead[Delivery] = ClaimedAhead(
            clock or (lambda: datetime.now(UTC)),
            settings.max_hold,
            keep_alive=lambda delivery: settle_quietly(delivery.in_progress()),
            keep_alive_every=settings.keep_held_alive,
        )
        self.runs_inline = runs_inline or (lambda hint: False)
        self.prepare = prepare
        # Whether inline work has come this way: until it has, the fetch loop
        # sizes its fetches by the process slots alone, as before there were two
        # pools (a worker full of shell jobs leaves the rest to other workers).
        self.inline_seen = False
        self._releasing = asyncio.Lock()  # run_until_due's own (it alone releases held runs)
        self._held_starts: set[asyncio.Task[None]] = set()  # starts of held runs under way
        # Set while no start of held runs is under way (the completer waits for it).
        self._held_starts_idle = asyncio.Event()
        self._held_starts_idle.set()

    async def start(self, deliveries: Sequence[Delivery], group: asyncio.TaskGroup) -> None:
        """Start in one statement, spawn executions; settle what cannot start."""
        await self.start_taken(self.take_in(deliveries), group)

    def take_in(self, deliveries: Sequence[Delivery]) -> Taken:
        """The synchronous half of a start: sort the fetched deliveries, take their slots.

        Called by the fetch loop before it fetches again, so that the next
        fetch is sized by the slots these took. Copies of runs executing or
        starting here are settled by :meth:`start_taken`; runs not yet due are
        held (actors/worker/claimed_ahead.py); the due ones each take a slot of their pool,
        and those that find none wait in the hold, as due.
        """
        taken = Taken(self)
        starting = self.holding.starting
        candidates: list[tuple[DispatchMessage, Delivery]] = []
        for delivery in deliveries:
            message = delivery.message
            key = (message.run_id, message.epoch)
            if delivery.delivery_count > 1:
                REDELIVERIES.inc()
            if key in self.holding.in_flight:
                # Executing here already (the broker redelivered while it ran):
                # settle this copy; the running one records and acks.
                DELIVERIES_SKIPPED.labels(reason="executing_here").inc()
                taken.settle.append(delivery.ack)
                continue
            if key in starting:
                # In a start here still waiting for its reply (another
                # batch's, or this one's): that copy is settled with it;
                # this one comes back later and finds the run executing
                # here, or settled.
                DELIVERIES_SKIPPED.labels(reason="starting_here").inc()
                taken.settle.append(functools.partial(delivery.nak, delay=1.0))
                continue
            self.inline(message)  # noted: the fetches may grow with the inline pool
            starting.add(key)  # no other start takes it meanwhile
            taken.keys.append(key)
            candidates.append((message, delivery))
        if self.prepare is not None:
            self._prepare(candidates)
        taken.batch = self.until_due.split(candidates, room=len(candidates), admit=self.admit)
        return taken

    def _prepare(self, candidates: Sequence[tuple[DispatchMessage, Delivery]]) -> None:
        """Tell the executor which kinds of runs are coming, and how many of each."""
        assert self.prepare is not None
        kinds: dict[str, int] = {}
        for message, _ in candidates:
            if message.executor is not None:
                kinds[message.executor] = kinds.get(message.executor, 0) + 1
        for kind, count in kinds.items():
            self.prepare(kind, count)

    async def start_taken(self, taken: Taken, group: asyncio.TaskGroup) -> None:
        """The rest of a start: settle the copies, start the admitted runs, free the slots."""
        try:
            for reply in taken.settle:
                await settle_quietly(reply())
            if taken.batch:
                await self._start(taken.batch, [(m.run_id, m.epoch) for m, _ in taken.batch], group)
        finally:
            taken.finish()

    def inline(self, message: DispatchMessage) -> bool:
        """Whether the run executes on the event loop (an async python callable)."""
        if self.runs_inline(message.executor):
            self.inline_seen = True
            return True
        return False

    def admit(self, message: DispatchMessage) -> bool:
        """Take a slot of the run's pool for its start, if one is free.

        (While the worker could not keep what it starts, see Keeping, nothing
        is fetched, and run_until_due releases no held run: they wait, or are
        redelivered to a worker that can.)
        """
        inline = self.inline(message)
        if self.holding.free(inline) <= 0:
            return False
        self.holding.take(1, inline)
        return True

    def release(self, batch: Sequence[tuple[DispatchMessage, Delivery]]) -> None:
        """Give back the start's slots (an execution holds a slot of its own)."""
        inline = sum(1 for m, _ in batch if self.inline(m))
        if inline:
            self.holding.give(inline, True)
        if len(batch) - inline:
            self.holding.give(len(batch) - inline, False)

    async def _start(
        self,
        batch: list[tuple[DispatchMessage, Delivery]],
        keys: list[Key],
        group: asyncio.TaskGroup,
        released: float | None = None,
    ) -> None:
        """``released``: the monotonic time held runs were released for this start."""
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
                await settle_quietly(delivery.nak(delay=1.0))
            if not isinstance(exc, Outage):
                raise
            self.keeping.failed(STARTS, repr(exc)[:200])
            log.warning(
                "start failed; messages will be redelivered", error=repr(exc), runs=len(batch)
            )
            return
        self.keeping.succeeded(STARTS)
        by_key = {(m.run_id, m.epoch): d for m, d in batch}
        messages = {(m.run_id, m.epoch): m for m, _ in batch}
        # The started runs enter the in-flight set before anything else is
        # awaited: from here on they are begun, never to be taken up again.
        inline = {(m.run_id, m.epoch): self.inline(m) for m, _ in batch}
        for run in started:
            key = (run.run_id, run.epoch)
            trace = messages[key].trace_context
            if trace:  # tracing on at the claimer: the run's span is the dispatch's child
                run = replace(run, trace_context=trace)
            entry = InFlight(run.run_id, run.epoch, run.job, by_key[key])
            self.holding.hold(entry)
            entry.task = group.create_task(self.execute(run, entry))
            self.holding.executing(entry.task, inline.get(key, False))
        if started and released is not None:
            self._keep_if_late(released, [by_key[(r.run_id, r.epoch)] for r in started])
        for key in keys:
            self.start_unknown.pop(key, None)  # answered: started now, or never will be
        for skipped in not_started:
            if skipped.reason is StartRefusal.EARLY:
                # Not yet due on the database's clock (this worker's estimate ran fast).
                key = (skipped.run_id, skipped.epoch)
                self.until_due.again(messages[key], by_key[key])
                continue
            DELIVERIES_SKIPPED.labels(reason=skipped.reason.value).inc()
            delivery = by_key[(skipped.run_id, skipped.epoch)]
            log.info(
                "delivery changed nothing",
                run_id=skipped.run_id,
                epoch=skipped.epoch,
                reason=skipped.reason.value,
                state=skipped.state,
            )
            # Unknown: not a run of this database (or a run claimed ahead and then
            # withdrawn by a schedule change); terminate so it is never redelivered.
            await settle_quietly(
                delivery.term() if skipped.reason is StartRefusal.UNKNOWN else delivery.ack()
            )

    async def run_until_due(self, group: asyncio.TaskGroup) -> None:
        """Start held runs at their instants, within the free slots, until closed."""

        def free() -> int:
            # Each run taken is admitted to its pool (admit takes its slot).
            return 0 if self.keeping.trouble() is not None else START_BATCH

        in_flight = asyncio.Semaphore(HELD_STARTS_IN_FLIGHT)

        async def start(batch: list[tuple[DispatchMessage, Delivery]]) -> None:
            # Their slots were taken by admit, before anything was awaited. The
            # start runs beside the next ones (an instant of 10,000 runs is a
            # few statements, on as many connections, at once): this returns as
            # soon as it is under way, or waits for a place among them.
            released = time.monotonic()
            await in_flight.acquire()
            taken = Taken(self)
            taken.batch = batch
            taken.keys = [(m.run_id, m.epoch) for m, _ in batch]
            self.holding.starting.update(taken.keys)
            task = group.create_task(self._start(batch, taken.keys, group, released))
            self._held_starts.add(task)
            self._held_starts_idle.clear()
            task.add_done_callback(self._held_start_ended)
            task.add_done_callback(taken.finish)  # even one cancelled before it began
            task.add_done_callback(lambda _: in_flight.release())

        await self.until_due.run(
            start, free, self.holding.slot_freed, self._releasing, admit=self.admit
        )

    def _keep_if_late(self, released: float, deliveries: Sequence[Delivery]) -> None:
        """Runs held for their instant whose start took long get a fresh word to the broker.

        A held delivery's last word (``in_progress``) comes just before its release,
        and the next is the heartbeat's, up to a beat after the run entered the
        in-flight set: a start slower than ``keep_held_alive`` (a herd on a busy
        host) left the broker's ``ack_wait`` to run out first, and every such run
        came back as a redelivery that changed nothing (thousands at one instant,
        each a fetch and a start statement more at the worst moment).
        """
        if time.monotonic() - released < self.settings.keep_held_alive.total_seconds():
            return
        self.until_due.keep_alive_beside(deliveries)

    def _held_start_ended(self, task: asyncio.Task[None]) -> None:
        self._held_starts.discard(task)
        if not self._held_starts:
            self._held_starts_idle.set()

    async def held_starts_first(self, at_most: float) -> None:
        """Wait (``at_most`` seconds) while runs held for their instant are being started.

        The completer records verdicts after this: at a herd's instant the runs
        that finished first would otherwise be recorded by statements that
        compete with the starts of the instant's other runs, on this replica's
        loop and in the database, and the last runs of the instant would begin
        later. A verdict waits at most ``at_most``; its run stays in flight (its
        delivery kept) meanwhile.
        """
        if self._held_starts_idle.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._held_starts_idle.wait(), at_most)

    async def hand_back_held(self, until_due: asyncio.Task[None]) -> None:
        """At a stop: runs held, not started, go back to the broker at once for others.

        The starts of held runs still under way finish first: what they start
        is then drained with the rest of the in-flight runs.
        """
        self.until_due.close()
        await asyncio.wait([until_due])
        if self._held_starts:
            await asyncio.wait(set(self._held_starts))
        held = self.until_due.take_all()
        if held:
            log.info("stopping: held runs handed back unstarted", runs=len(held))
        for _, delivery in held:
            await settle_quietly(delivery.nak())

    def _remember_start_unknown(self, keys: Sequence[Key]) -> None:
        for key in keys:
            self.start_unknown[key] = None
            self.start_unknown.move_to_end(key)
        while len(self.start_unknown) > START_UNKNOWN_KEPT:
            self.start_unknown.popitem(last=False)

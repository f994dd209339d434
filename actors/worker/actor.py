"""The worker actor: its loop, its stop and its recovery after a crash.

Fetch (``intake``) -> start in one statement (``starting``) -> execute
(``executing``) -> record in batches, then ack (``completing``); the leases
of the runs it holds are extended meanwhile (``heartbeat``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from actors.observability import get_logger
from actors.pacing import Probe
from actors.ports import (
    Clock,
    Delivery,
    Executor,
    Inbox,
    MovingClock,
    Outage,
    Preparing,
    WorkerStore,
    settle_quietly,
)
from actors.worker.completing import Completer
from actors.worker.executing import Execution
from actors.worker.heartbeat import Heartbeat, InFlight, Keeping
from actors.worker.holding import Holding, Key, Pending
from actors.worker.intake import Intake
from actors.worker.settings import WorkerSettings
from actors.worker.starting import Starter

log = get_logger("worker")
FETCH_TIMEOUT_S = 1.0
# Deliveries fetched at most at once (and no more than the free slots). A herd
# claimed ahead arrives thousands at a time: in fetches of 256, each a round
# trip to the broker (and, once due, a start statement, two in flight), the
# runs reached their workers seconds after they were published.
FETCH_BATCH = 1024
# Starts waiting for start_runs at once: one overlapping the next fetch is what
# keeps the database busy; more would only queue on its connections.
STARTS_IN_FLIGHT = 2
RECORD_AT_STOP_S = 5.0  # at most this past the grace for the last verdicts (less on short leases)


class Worker:
    """Executes dispatched runs with at most ``settings.concurrency`` at a time."""

    def __init__(
        self,
        store: WorkerStore,
        inbox: Inbox,
        executor: Executor,
        settings: WorkerSettings,
        *,
        stop: asyncio.Event,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.stop = stop
        self.holding = Holding(settings.concurrency, settings.inline_concurrency)
        # A database call unanswered for a quarter of the lease is failing: the
        # leases it would extend are running out (the lease's own deadlines,
        # statement and acquire, fit inside this).
        self.keeping = Keeping(settings.stall_threshold)
        self._hb_stop = asyncio.Event()
        self.heartbeat = Heartbeat(
            lambda runs: store.extend_leases(settings.worker_id, runs, settings.lease),
            self.holding.in_flight,
            settings.heartbeat_interval,
            self._hb_stop,
            outage=Outage,
            keeping=self.keeping,
        )
        self.intake = Intake(
            inbox,
            self.keeping,
            Probe(lambda: store.ping(), self.keeping.stall_after),
            stop,
            lambda: len(self.holding.in_flight),
        )
        self.starter = Starter(
            store,
            settings,
            self.holding,
            self.keeping,
            Execution(executor, settings.worker_id, self.holding, clock),
            clock.now if clock is not None else None,
            executor.runs_inline,
            executor.prepare if isinstance(executor, Preparing) else None,
        )
        self.completer = Completer(
            store, self.holding, self.keeping, self.starter.held_starts_first
        )
        if isinstance(clock, MovingClock):
            # A held run waits for its instant on this clock: a jump must end that wait.
            clock.on_moved(self.starter.until_due.clock_moved)

    @property
    def in_flight(self) -> dict[Key, InFlight]:
        return self.holding.in_flight

    @property
    def completions(self) -> asyncio.Queue[Pending | None]:
        return self.holding.completions

    async def handle(self, deliveries: Sequence[Delivery], group: asyncio.TaskGroup) -> None:
        """One fetched batch: started in one statement, executions spawned into ``group``."""
        await self.starter.start(deliveries, group)

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch, start, execute, record, ack until ``stop``; then drain within the grace."""
        try:
            await self._run()
        except BaseException:
            self._after_crash()
            raise

    def _after_crash(self) -> None:
        """Forget the runs a crashed loop can no longer finish, so nothing keeps them alive.

        The supervisor reruns this same worker. Its executions were cancelled
        (one cancelled before it began never cleaned up after itself) and the
        batch being recorded was dropped: those runs leave the in-flight set, so
        the heartbeat stops extending their leases and the reaper recovers them
        under a new epoch (a redelivery does not start them again here: they
        were begun, see ``Starter.start_unknown``). Verdicts still queued are
        kept and recorded on the restart, still heartbeated until then.
        """
        self.starter.until_due.take_all()  # never started: redelivered after ack_wait
        queue = self.holding.completions
        queued = []
        while not queue.empty():
            queued.append(queue.get_nowait())
        for item in queued:
            queue.put_nowait(item)
        waiting = {(p.completion.run_id, p.completion.epoch) for p in queued if p is not None}
        lost = [
            e
            for key, e in self.holding.in_flight.items()
            if key not in waiting and (e.task is None or e.task.done())
        ]
        for entry in lost:
            self.holding.forget(entry)
        if lost:
            log.warning(
                "worker loop crashed; its unfinished runs are left to their leases",
                runs=len(lost),
                run_ids=[e.run_id for e in lost][:20],
            )

    async def _run(self) -> None:
        self.intake.backoff.reset()
        holding = self.holding
        async with asyncio.TaskGroup() as group:
            completer = group.create_task(self.completer.run())
            heartbeat = group.create_task(self.heartbeat.run())
            # A start is not awaited here: the next fetch overlaps it, so the
            # round trips of fetch and start_runs do not add up per batch.
            starts: set[asyncio.Task[None]] = set()
            self.starter.until_due.open()
            until_due = group.create_task(self.starter.run_until_due(group))
            while not self.stop.is_set():
                if self.keeping.trouble() is not None:
                    await self.intake.until_kept()
                    continue
                if len(starts) >= STARTS_IN_FLIGHT:
                    await asyncio.wait(starts, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # Fetched runs take their slots when admitted to a start (each
                # in its pool); what finds none waits in the hold, as due.
                free = holding.free(False)
                if self.starter.inline_seen:
                    free += holding.free(True)
                if free <= 0:
                    holding.slot_freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(holding.slot_freed.wait(), 1.0)
                    continue
                deliveries = await self.intake.fetch(min(free, FETCH_BATCH), FETCH_TIMEOUT_S)
                if deliveries:
                    # Their slots are taken now, before the next fetch is sized.
                    taken = self.starter.take_in(deliveries)
                    # In the group: a bug raised by a start stops the worker, as
                    # it did inline, for the supervisor to see.
                    start = group.create_task(self.starter.start_taken(taken, group))
                    starts.add(start)
                    start.add_done_callback(starts.discard)
                    start.add_done_callback(taken.finish)  # even one cancelled before it began
            if starts:
                await asyncio.wait(starts)  # their executions are drained with the rest
            stopping = time.monotonic()
            await self.starter.hand_back_held(until_due)
            await self._drain()
            await self._record_what_is_left(completer, stopping)
            self._hb_stop.set()
            await heartbeat

    async def _record_what_is_left(self, completer: asyncio.Task[None], since: float) -> None:
        """Queued verdicts get the rest of the grace, and a few seconds at least, to be recorded.

        Past that the database is not taking them (away, or its link went
        silent): the completer stops and their runs are left to their leases,
        rather than holding the stop until the replica forces it.
        """
        left = max(
            self.settings.grace.total_seconds() - (time.monotonic() - since),
            min(self.keeping.stall_after, RECORD_AT_STOP_S),
        )
        try:
            async with asyncio.timeout(left):
                await self.holding.completions.put(None)
                await completer  # cancelled with this wait when the time is up
        except TimeoutError:
            log.warning(
                "stopping: verdicts not recorded in time; their runs are left to their leases",
                runs=len(self.holding.in_flight),
                waited_s=round(left, 3),
                run_ids=[e.run_id for e in self.holding.in_flight.values()][:20],
            )

    async def _drain(self) -> None:
        """Let in-flight runs finish up to the grace; cancel the rest (the lease recovers them)."""
        in_flight = self.holding.in_flight
        grace = self.settings.grace.total_seconds()
        tasks = [e.task for e in in_flight.values() if e.task is not None]
        if not tasks:
            return
        log.info("draining in-flight runs", runs=len(tasks), grace_s=grace)
        _, pending = await asyncio.wait(tasks, timeout=grace)
        if not pending:
            return
        cut = [e for e in in_flight.values() if e.task in pending]
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)
        try:
            async with asyncio.timeout(5):
                handed_back = await self.store.interrupt_runs(
                    self.settings.worker_id, [(e.run_id, e.epoch) for e in cut]
                )
        except Exception as exc:  # noqa: BLE001 - stopping anyway; the leases recover them
            # Not re-raised even when it is a bug: the supervisor would restart the
            # worker in the middle of the stop. Logged at the level of what it is.
            level = "warning" if isinstance(exc, Outage | TimeoutError) else "error"
            getattr(log, level)(
                "grace expired; runs left to their leases", runs=len(cut), error=repr(exc)
            )
            return
        log.warning(
            "grace expired; unfinished runs handed back to pending",
            runs=handed_back,
            run_ids=[e.run_id for e in cut][:20],
        )
        for entry in cut:
            # That epoch's message is obsolete: the run will be claimed anew.
            await settle_quietly(entry.message.ack())

"""Until due: runs claimed ahead wait in their worker until their instant, then start together.

A run may be claimed up to ``claim_ahead`` before it is due (the claimer's
``claim_ahead``), so that at its instant it is already in a worker's hands:
only the start statement stands between the instant and the execution, not a
poll, a claim, a publish and a fetch. The worker holds each such delivery
here until its ``due_at`` on the database's clock (the worker's estimate of
it, :class:`actors.scheduling.database_clock.DatabaseClock`), then starts every run of that
instant in one START_RUNS statement.

What keeps it correct:

- START_RUNS starts no claimed run before it is due on the database's own
  clock; a run released a little early (the estimate ran fast) is refused as
  "early" and held again (:meth:`ClaimedAhead.again`), a little longer each time.
- A hold lasts at most ``max_hold`` (``lease / 8``, see
  ``actors.domain.lease``): a message held longer than its claim meant (a
  clock estimate far off) is tried, and the database says whether it is due.
- The wait for an instant is on the monotonic clock, computed from the
  estimate of the database's, which is itself the last read of the database's
  clock plus the monotonic time since (a step of the host's wall clock does
  not move it); when the estimate jumps (a read found it off, a test's clock
  moved) the clock says so and the wait is computed again
  (:meth:`ClaimedAhead.clock_moved`).
- A held message is kept from redelivery: ``in_progress`` every
  ``keep_alive_every`` (``ack_wait / 3``), so that at its release its last
  word to the broker is recent enough for the start and the first heartbeat
  to come before ``ack_wait`` runs out.
- The claim's lease covers the hold (``claim_ahead`` is a term of the lease
  invariant); the heartbeat does not extend held runs. A hold that overruns
  its lease cannot double the run: the reaper gives it a new epoch, and the
  held message's start is refused by the epoch guard.
- One starter at a time (the worker's lock around this and its own starts),
  and never more than the free slots: the concurrency bound holds.
- At a stop the held deliveries are handed back to the broker at once (nak),
  for another worker to hold and start; after a crash they are dropped and
  the broker redelivers them after ``ack_wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from actors.observability import ARRIVED_AHEAD
from actors.ports import DispatchMessage

D = TypeVar("D")
Pair = tuple[DispatchMessage, D]

# A run refused as early is tried again after this, doubled each time, up to the cap.
EARLY_RETRY = timedelta(milliseconds=1)
EARLY_RETRY_MAX = timedelta(milliseconds=100)
EARLY_KEPT = 10_000
SLOT_RECHECK_S = 1.0  # no slot: look again after this at the latest (as the fetch loop does)
KEEP_ALIVE_AT_ONCE = 500  # in_progress replies sent together
# How often the loop looks for held deliveries whose keep-alive is due while it is
# busy releasing (each look is two passes over the hold); far below ack_wait / 3.
KEEP_LOOK_EVERY = 0.1


@dataclass
class _Held(Generic[D]):
    message: DispatchMessage
    delivery: D
    release_at: datetime  # the database's clock (estimated): when to start it
    early: int = 0  # times the database said "not yet due"
    marked: float = 0.0  # monotonic time of its last word to the broker (delivery, in_progress)


class ClaimedAhead(Generic[D]):
    """Deliveries of runs not yet due, by (run id, epoch), released by instant.

    ``clock`` is the database's time as this worker estimates it. The methods
    other than :meth:`run` are synchronous and pure bookkeeping; :meth:`run`
    is the one loop, waiting for the next instant, a new earlier arrival or a
    free slot.
    """

    def __init__(
        self,
        clock: Callable[[], datetime],
        max_hold: timedelta,
        keep_alive: Callable[[D], Awaitable[None]] | None = None,
        keep_alive_every: timedelta | None = None,
    ) -> None:
        """``keep_alive(delivery)``: tells the broker the delivery is still being worked on."""
        self.clock = clock
        self.max_hold = max_hold
        self.keep_alive = keep_alive
        self.keep_alive_every = (keep_alive_every or timedelta(0)).total_seconds()
        self._held: dict[tuple[str, int], _Held[D]] = {}
        # Times the database said "not yet due", of runs taken out for a start
        # (so that a clock estimate far off backs off); bounded, rarely filled.
        self._early: dict[tuple[str, int], int] = {}
        self._changed = asyncio.Event()
        self._closed = False
        self._keeping: set[asyncio.Task[None]] = set()  # keep-alives being sent

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    # -- bookkeeping ----------------------------------------------------------------------

    def split(
        self,
        decoded: Sequence[Pair[D]],
        room: int,
        admit: Callable[[DispatchMessage], bool] | None = None,
    ) -> list[Pair[D]]:
        """The deliveries to start now (due, at most ``room``, admitted); the others are held.

        A message without ``due_at`` (an older claimer) or already due starts
        now; one due later is held until ``due_at``, for at most ``max_hold``.
        Due ones beyond ``room``, or that ``admit`` (which takes the run's slot
        when it says yes) turns away, are held as due, started when slots free.
        A copy of a delivery held already (the broker redelivered it) takes its
        place: the newest delivery is the one to settle.
        """
        now = self.clock()
        start: list[Pair[D]] = []
        for message, delivery in decoded:
            key = (message.run_id, message.epoch)
            held = self._held.get(key)
            if held is not None:
                held.delivery = delivery
                held.marked = time.monotonic()
                continue
            due = message.due_at
            if due is not None:
                ARRIVED_AHEAD.observe(max(0.0, (due - now).total_seconds()))
            if (
                (due is None or due <= now)
                and len(start) < room
                and (admit is None or admit(message))
            ):
                start.append((message, delivery))
                continue
            release = now if due is None or due <= now else min(due, now + self.max_hold)
            self._put(_Held(message, delivery, release))
        return start

    def again(self, message: DispatchMessage, delivery: D) -> None:
        """The database said "not yet due" (the clock estimate ran fast): hold a little more."""
        key = (message.run_id, message.epoch)
        tries = self._early.pop(key, 0) + 1
        wait = min(EARLY_RETRY * 2 ** (tries - 1), EARLY_RETRY_MAX)
        now = self.clock()
        due = message.due_at or now
        # Its last word to the broker is not known here: kept alive at the next look.
        marked = time.monotonic() - self.keep_alive_every
        self._put(_Held(message, delivery, max(due, now + wait), tries, marked))

    def due(
        self, limit: int, admit: Callable[[DispatchMessage], bool] | None = None
    ) -> list[Pair[D]]:
        """Take up to ``limit`` held deliveries whose time has come, earliest instant first.

        The runs of one instant share their release time, so they come out
        together (one start statement) whenever ``limit`` allows. With
        ``admit``, only the ones it admits (taking their slots): a full pool
        leaves its runs held while the other pool's are taken.
        """
        if limit <= 0:
            return []
        now = self.clock()
        ready = sorted(
            (h for h in self._held.values() if h.release_at <= now), key=lambda h: h.release_at
        )
        if admit is None:
            ready = ready[:limit]
        else:
            admitted: list[_Held[D]] = []
            for h in ready:
                if len(admitted) >= limit:
                    break
                if admit(h.message):
                    admitted.append(h)
            ready = admitted
        for h in ready:
            key = (h.message.run_id, h.message.epoch)
            del self._held[key]
            if h.early:
                if len(self._early) >= EARLY_KEPT:
                    self._early.clear()
                self._early[key] = h.early
        return [(h.message, h.delivery) for h in ready]

    def next_release(self) -> datetime | None:
        """When the earliest held delivery is to start (database clock), or None."""
        return min((h.release_at for h in self._held.values()), default=None)

    def take_all(self) -> list[Pair[D]]:
        """Everything held, removed (a stop hands them back; a crash drops them)."""
        taken = [(h.message, h.delivery) for h in self._held.values()]
        self._held.clear()
        self._early.clear()
        return taken

    def _put(self, held: _Held[D]) -> None:
        if not held.marked:
            held.marked = time.monotonic()
        self._held[(held.message.run_id, held.message.epoch)] = held
        self._changed.set()

    async def keep_alive_due(self) -> float | None:
        """Tell the broker the held deliveries whose last word is getting old are still held.

        Every ``keep_alive_every``, and once more within the last half-period
        before a delivery's release: released, it is started, executed and its
        first heartbeat beats, and all of that must come before ``ack_wait``
        runs out from its last word (a herd's start under load takes a second or
        two). Returns in how many seconds the next one is due, None when nothing
        is held (or there is no keep-alive). Their marks move before anything is
        awaited, so a delivery is kept alive once per period.
        """
        await self._send_keep_alives([h.delivery for h in self._mark_old()])
        return self._next_keep_alive_in()

    def _mark_old(self) -> list[_Held[D]]:
        """The held deliveries whose keep-alive is due, their marks moved to now."""
        if self.keep_alive is None or not self.keep_alive_every or not self._held:
            return []
        now, db_now = time.monotonic(), self.clock()
        old = [h for h in self._held.values() if now >= self._keep_alive_at(h, db_now)]
        for h in old:
            h.marked = now
        return old

    async def _send_keep_alives(self, deliveries: Sequence[D]) -> None:
        keep_alive = self.keep_alive
        if keep_alive is None:
            return
        for i in range(0, len(deliveries), KEEP_ALIVE_AT_ONCE):
            await asyncio.gather(*(keep_alive(d) for d in deliveries[i : i + KEEP_ALIVE_AT_ONCE]))

    def keep_alive_beside(self, deliveries: Sequence[D]) -> None:
        """Tell the broker these deliveries are still being worked on, in a task of their
        own (the worker's starts of held runs that took long: see Starter)."""
        if not deliveries or self.keep_alive is None:
            return
        task = asyncio.ensure_future(self._send_keep_alives(deliveries))
        self._keeping.add(task)
        task.add_done_callback(self._keeping.discard)

    def _next_keep_alive_in(self) -> float | None:
        """In how many seconds the next keep-alive is due (None: nothing held, or none)."""
        if self.keep_alive is None or not self.keep_alive_every or not self._held:
            return None
        db_now = self.clock()
        soonest = min(self._keep_alive_at(h, db_now) for h in self._held.values())
        now = time.monotonic()
        return max(0.0, min(soonest, now + self.keep_alive_every) - now)

    def _keep_alive_beside(self) -> float | None:
        """Send the keep-alives due in a task of their own: the starts of due runs do not
        wait for them (10,000 held runs are 10,000 replies to the broker, and a
        herd's runs waiting for slots are kept alive every half-period: a start
        of 1,000 at a time waited about a second behind each round of them)."""
        self.keep_alive_beside([h.delivery for h in self._mark_old()])
        return self._next_keep_alive_in()

    def _keep_alive_at(self, held: _Held[D], db_now: datetime) -> float:
        """The monotonic time the delivery's next keep-alive is due."""
        every = self.keep_alive_every
        until_release = (held.release_at - db_now).total_seconds()
        if until_release <= every:
            # The last half-period before its release: its word is made fresh.
            fresh_before = time.monotonic() + until_release - every / 2
            return min(held.marked + every, max(held.marked + every / 2, fresh_before))
        return held.marked + every

    # -- the loop -------------------------------------------------------------------------

    def open(self) -> None:
        """Before :meth:`run` (again, after a crash): nothing held, not closed."""
        self.take_all()
        self._closed = False

    def clock_moved(self) -> None:
        """The clock jumped (a skew re-measured, a test's clock moved): wait again from now.

        :meth:`run` waits for the next release on the monotonic clock, for a
        delay computed from ``clock`` before the wait; a jump of ``clock`` is
        invisible to that wait, which would otherwise be slept out (up to the
        next keep-alive, ``ack_wait / 3``) with the run already due.
        """
        self._changed.set()

    def close(self) -> None:
        """Ask :meth:`run` to return (after the start it is in, if any)."""
        self._closed = True
        self._changed.set()

    async def run(
        self,
        start: Callable[[list[Pair[D]]], Awaitable[None]],
        free: Callable[[], int],
        slot_freed: asyncio.Event,
        starting: asyncio.Lock,
        admit: Callable[[DispatchMessage], bool] | None = None,
    ) -> None:
        """Start held runs at their instants until :meth:`close`.

        Under ``starting`` (the worker's lock around every start) the free
        slots are counted and that many due runs taken and started, so this
        and the worker's own starts together never exceed its concurrency.
        With ``admit``, each run taken is admitted to its pool (see :meth:`due`).
        Between instants the held deliveries are kept alive.
        """
        keep_at: float | None = None  # monotonic time the next keep-alive is due
        looked = -KEEP_LOOK_EVERY
        while not self._closed:
            self._changed.clear()
            now = time.monotonic()
            if keep_at is None or now - looked >= KEEP_LOOK_EVERY or now >= keep_at:
                # Two passes over everything held: at most every KEEP_LOOK_EVERY while
                # an instant's runs are released a batch at a time.
                found = self._keep_alive_beside()
                keep_at, looked = (None if found is None else now + found), now
                keep_in = found
            else:
                # Not looked at just now: look again soon (something may have come in
                # whose word is due before keep_at).
                keep_in = min(max(0.0, keep_at - now), KEEP_LOOK_EVERY - (now - looked))
            release = self.next_release()
            if release is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), keep_in)
                continue
            delay = (release - self.clock()).total_seconds()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait(), delay if keep_in is None else min(delay, keep_in)
                    )
                continue
            async with starting:
                batch = self.due(free(), admit)
                if batch:
                    await start(batch)
                    continue
            # Due, but no slot (all taken, or the worker cannot keep runs now):
            # wait until one frees, something arrives, or a second to look again.
            slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(slot_freed, self._changed), SLOT_RECHECK_S)


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()

"""The one clock: PostgreSQL's. Read it, measure how far this replica's clock is off.

Every decision about time that replicas must agree on (which instants are due,
which are missed, where a new job starts, deadlines, leases) is made on the
database's ``now()``: in the statement itself, or read once per tick here and
passed into the pure domain. A replica's own wall clock may be minutes off (an
NTP outage, a VM resumed from suspend, a badly set host); it drives only local
timers, which run on the monotonic clock. This module measures the difference,
exports it (``claimd_clock_skew_seconds``) and warns when it is large.

Between reads the database's time is estimated from the last read and the
monotonic clock (the database's time at the read plus the monotonic time
elapsed since), never from the wall clock: a host whose time sync steps the
wall clock (+5 minutes, then back) does not move the estimate, so a worker
holding runs claimed ahead still starts them at their instants.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from actors import clocks
from actors.clocks import SystemClock
from actors.observability import CLOCK_SKEW, get_logger
from actors.pacing import wait_for_stop
from actors.ports import Clock, MovingClock

log = get_logger("clock")

# Beyond this the replica's clock is worth an operator's look; claimd itself
# keeps working whatever the skew, since it never decides on the local clock.
SKEW_WARNING = timedelta(seconds=2)
# At most one warning per this long: the gauge carries the value every tick.
WARN_EVERY = timedelta(minutes=1)
# A read that finds the estimate this far off the database's clock moves it:
# what waits for an instant on it (the worker's held runs) is told (``on_moved``).
ESTIMATE_MOVED = timedelta(milliseconds=5)


class DatabaseNow(Protocol):
    """What the clock needs from the store (``RunStore.database_now``)."""

    async def database_now(self) -> datetime: ...


class DatabaseClock:
    """The database's clock as this replica sees it.

    ``read()`` is one round trip that returns the database's ``now()`` and
    measures the skew: the local wall clock at the midpoint of the round trip
    minus the database's time (for the gauge and the warning only). ``now()``
    estimates the database's time as the time the last read returned plus the
    monotonic time elapsed since the midpoint of its round trip: for metrics
    such as start lag that are taken between reads, and for the worker's wait
    for a held run's instant; it never decides anything replicas must agree on.
    The wall clock is not part of it (before the first read it is all there
    is), so a step of the host's clock does not move it.

    A MovingClock: the estimate jumps when a read finds it off the database's
    clock (the first read; the database's clock stepped; the monotonic clock's
    rate drifted) or when the local clock says it jumped (a test's
    ManualClock, whose time is also its monotonic clock); ``on_moved``
    callbacks hear of both. A wait for an instant computed on the estimate is
    a wait on the monotonic clock, which sees neither.
    """

    def __init__(
        self,
        store: DatabaseNow,
        *,
        local: Clock | None = None,
        warn_above: timedelta = SKEW_WARNING,
        warn_every: timedelta = WARN_EVERY,
        monotonic: Callable[[], float] = clocks.monotonic,
    ) -> None:
        self.store = store
        self.local = local or SystemClock()
        self.warn_above = warn_above.total_seconds()
        self.warn_every = warn_every.total_seconds()
        self.monotonic = monotonic
        self.skew = timedelta(0)
        # The last read: the database's time, and the monotonic time it was read at.
        self._anchor: tuple[datetime, float] | None = None
        self._warned_at: float | None = None
        self._moved: list[Callable[[], None]] = []
        if isinstance(self.local, MovingClock):
            self.local.on_moved(self._tell_moved)

    def on_moved(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever the estimate (:meth:`now`) jumps."""
        self._moved.append(callback)

    def _tell_moved(self) -> None:
        for callback in self._moved:
            callback()

    async def read(self) -> datetime:
        """The database's now(); measures and exports this replica's skew."""
        sent_wall = self.local.now()
        sent = self.monotonic()
        db_now = await self.store.database_now()
        received = self.monotonic()
        round_trip = received - sent
        self.skew = sent_wall + timedelta(seconds=round_trip / 2) - db_now
        before = self._estimate_at(received)
        self._anchor = (db_now, sent + round_trip / 2)
        if abs(self._estimate_at(received) - before) >= ESTIMATE_MOVED:
            self._tell_moved()
        skew_s = self.skew.total_seconds()
        CLOCK_SKEW.set(skew_s)
        if abs(skew_s) > self.warn_above:
            now = self.monotonic()
            if self._warned_at is None or now - self._warned_at >= self.warn_every:
                self._warned_at = now
                log.warning(
                    "clock skew: this replica's clock disagrees with the database's; "
                    "claimd decides on the database's clock, fix the host's time sync",
                    skew_s=round(skew_s, 3),
                    round_trip_s=round(round_trip, 4),
                    threshold_s=self.warn_above,
                )
        return db_now

    def now(self) -> datetime:
        """The database's time, estimated locally (metrics, a held run's wait)."""
        return self._estimate_at(self.monotonic())

    def _estimate_at(self, monotonic: float) -> datetime:
        """The estimate at monotonic time ``monotonic``: the last read plus the time since."""
        if self._anchor is None:
            return self.local.now() - self.skew
        db_then, read_at = self._anchor
        return db_then + timedelta(seconds=monotonic - read_at)

    async def run(self, stop: asyncio.Event, interval: timedelta) -> None:
        """Measure every ``interval`` (for replicas with no materializer reading it)."""
        while not stop.is_set():
            await self.read()
            await wait_for_stop(stop, interval.total_seconds())

"""Heartbeats: a running run extends its lease and tells JetStream it is in progress.

One task per worker extends the leases of all its running runs in one
statement per beat. A run whose extension is refused (reaped, cancelled) has
lost its lease: its execution is cancelled, since a newer attempt may run.

A beat that fails because the database is away is retried at the next beat
(the lease has slack). The deliveries are kept (``in_progress``) at every beat
whatever the database does, and never wait for an extension to answer: a
redelivery cannot recover a run that is executing (its start is refused while
its lease lives; once the lease lapses the reaper hands it to a new attempt
with a new message), so letting JetStream redeliver while an extension is slow
only makes a copy that changes nothing and counts as a redelivery.

Any other failure is a bug and is raised: the worker stops with it, its
executions are cancelled and the supervisor restarts it. Going on without
heartbeats would let the leases lapse under executions that keep running, so
another worker would run them a second time.

:class:`Keeping` is what the worker asks before it fetches more: whether the
leases it holds can be extended and its verdicts recorded. A run started while
they cannot be would outlive a lease nobody extends and be executed again
elsewhere, so the worker takes nothing new until they can.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from actors.observability import LEASES_LOST, get_logger

log = get_logger("heartbeat")


class Settle(Protocol):
    """What the heartbeat and the completer do with a delivery."""

    async def in_progress(self) -> None: ...
    async def ack(self) -> None: ...
    async def term(self) -> None: ...


@dataclass
class InFlight:
    """A run executing on this worker, with the delivery that carried it."""

    run_id: str
    epoch: int
    job: str
    message: Settle
    task: asyncio.Task[None] | None = None
    lease_lost: bool = field(default=False)
    # Monotonic time its lease was last set (the start, then each extension sent).
    leased_at: float = field(default_factory=time.monotonic)


ExtendLeases = Callable[[Sequence[tuple[str, int]]], Awaitable[set[tuple[str, int]]]]

HEARTBEAT = "heartbeat"
COMPLETIONS = "completions"
STARTS = "starts"


class Keeping:
    """Whether this worker can keep what it starts: its database calls get through.

    Each source (``heartbeat``, ``completions``, ``starts``) reports its calls'
    failures and successes. A call still in progress after ``stall_after``
    counts as failing too: a silent connection fails a call only at its
    deadline, and runs started meanwhile would depend on it.
    """

    def __init__(self, stall_after: timedelta, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after = stall_after.total_seconds()
        self._clock = clock
        self._failing: dict[str, str] = {}
        self._calls: dict[object, tuple[str, float]] = {}
        self._answer = asyncio.Event()

    @contextlib.contextmanager
    def call(self, source: str) -> Iterator[None]:
        """Around one database call of ``source``: its duration is watched."""
        token = object()
        self._calls[token] = (source, self._clock())
        try:
            yield
        finally:
            del self._calls[token]

    def failed(self, source: str, error: str) -> None:
        self._failing[source] = error

    def succeeded(self, source: str) -> None:
        self._failing.pop(source, None)

    def answered(self) -> None:
        """The database answered a probe: what failed for want of it may go on.

        Completions stay failing until the completer records: their verdicts
        are the runs that would be doubled. Its wait before the next try is
        cut short (:meth:`rest`).
        """
        for source in (HEARTBEAT, STARTS):
            self._failing.pop(source, None)
        self._answer.set()
        self._answer = asyncio.Event()

    async def rest(self, seconds: float) -> None:
        """Wait ``seconds`` before trying again, or less if the database answers a probe."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answer.wait(), seconds)

    def stalled(self) -> tuple[str, float] | None:
        """The source of the oldest call in progress past ``stall_after``, and its age."""
        now = self._clock()
        oldest = max(
            ((now - began, source) for source, began in self._calls.values()), default=None
        )
        if oldest is None or oldest[0] <= self.stall_after:
            return None
        return oldest[1], oldest[0]

    def trouble(self) -> tuple[str, str] | None:
        """Why runs started now could not be kept (source, what), or None."""
        for source, error in self._failing.items():
            return source, f"failing: {error}"
        stalled = self.stalled()
        if stalled is not None:
            return stalled[0], f"no answer for {stalled[1]:.1f}s"
        return None


class Heartbeat:
    """Extends the leases of ``in_flight`` every ``interval`` until ``stop``.

    ``outage`` is the exception type that means "the server is away" (the
    worker passes ``ports.Outage``).
    """

    def __init__(
        self,
        extend: ExtendLeases,
        in_flight: dict[tuple[str, int], InFlight],
        interval: timedelta,
        stop: asyncio.Event,
        *,
        outage: type[Exception],
        keeping: Keeping | None = None,
    ) -> None:
        self.extend = extend
        self.in_flight = in_flight
        self.interval = interval
        self.stop = stop
        self.outage = outage
        self.keeping = keeping or Keeping(interval * 4)

    async def keep_deliveries(self) -> None:
        """``in_progress`` on the delivery of every run executing here whose lease is not lost."""
        for entry in list(self.in_flight.values()):
            if entry.lease_lost:
                continue
            with contextlib.suppress(Exception):
                await entry.message.in_progress()

    async def beat(self) -> None:
        """Extend the leases of the runs in flight; cancel those whose lease was lost.

        A lease set less than two beats ago is left as it is: it has nearly the whole
        lease ahead (the interval is at most a quarter of it, see
        ``actors.domain.lease``), and the runs of a herd, started together and
        mostly done in a second, cost the database no update of thousands of rows
        while the rest of their instant is being started. What it costs: a cancelled
        or reaped run younger than two beats is noticed at most two beats later.
        """
        now = time.monotonic()
        old_after = 2 * self.interval.total_seconds()
        entries = [e for e in self.in_flight.values() if now - e.leased_at >= old_after]
        if not entries:
            return
        with self.keeping.call(HEARTBEAT):
            kept = await self.extend([(e.run_id, e.epoch) for e in entries])
        self.keeping.succeeded(HEARTBEAT)
        for entry in entries:
            entry.leased_at = now
        for entry in entries:
            key = (entry.run_id, entry.epoch)
            if key not in self.in_flight or key in kept:
                continue  # finished meanwhile, or kept
            if entry.task is not None and not entry.task.done():
                LEASES_LOST.inc()
                entry.lease_lost = True
                log.warning(
                    "lease lost; cancelling execution",
                    run_id=entry.run_id,
                    job=entry.job,
                    epoch=entry.epoch,
                )
                entry.task.cancel()

    async def _extend(self) -> None:
        """One beat; an outage is noted at once (the intake reads it before it fetches)."""
        try:
            await self.beat()
        except self.outage as exc:  # the next beat retries; the lease has slack
            self.keeping.failed(HEARTBEAT, repr(exc)[:200])
            log.warning("heartbeat failed", error=repr(exc))

    @staticmethod
    def _settled(extension: asyncio.Task[None]) -> None:
        """A finished extension that failed other than by an outage is a bug: raised."""
        exc = extension.exception()
        if exc is not None:
            raise exc

    async def run(self) -> None:
        """Every ``interval``: keep the deliveries, and extend the leases unless an
        extension is still waiting for its answer (the next starts when it has one)."""
        extension: asyncio.Task[None] | None = None
        try:
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.interval.total_seconds())
                await self.keep_deliveries()
                if extension is not None and extension.done():
                    self._settled(extension)
                    extension = None
                if extension is None:
                    extension = asyncio.create_task(self._extend())
            if extension is not None:
                await asyncio.wait([extension])
                self._settled(extension)
                extension = None
        finally:
            if extension is not None and not extension.done():
                extension.cancel()
                with contextlib.suppress(BaseException):
                    await extension

"""The inbox port in memory, for unit tests of the worker (and an in-memory broker).

A broker delivers with :meth:`MemoryInbox.put`. Like a JetStream consumer
with explicit acks: a delivery nak'ed is delivered again after its delay, one
left unsettled for ``ack_wait`` is delivered again (an ``in_progress`` resets
that timer), each time with its delivery count one higher, up to
``max_deliver`` deliveries. Every verdict is recorded for the test's
assertions. Time is ``clock`` (seconds, monotonic), injectable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from actors.ports import DispatchMessage


@dataclass(eq=False)
class MemoryDelivery:
    """One delivery of a message; ``settled`` holds its verdicts (ack, nak, term) in order."""

    message: DispatchMessage
    delivery_count: int
    inbox: MemoryInbox
    settled: list[str] = field(default_factory=list)
    progress_marks: int = 0
    deadline: float = 0.0  # redelivered when still unsettled then (ack_wait)

    async def ack(self) -> None:
        self._settle("ack")

    async def term(self) -> None:
        self._settle("term")

    async def nak(self, delay: float | None = None) -> None:
        if self._settle("nak"):
            self.inbox._again(self, delay or 0.0)

    async def in_progress(self) -> None:
        self.progress_marks += 1
        if not self.settled:
            self.deadline = self.inbox._deadline()

    def _settle(self, verdict: str) -> bool:
        """Record the verdict; True if it is the one that counts (the first)."""
        first = not self.settled
        self.settled.append(verdict)
        if first:
            self.inbox._settled(self, verdict)
        return first


class MemoryInbox:
    def __init__(
        self,
        *,
        ack_wait: float | None = None,
        max_deliver: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.clock = clock
        self._ready: list[tuple[float, DispatchMessage, int]] = []  # (not before, message, count)
        self._out: list[MemoryDelivery] = []  # delivered, not settled yet
        self._changed = asyncio.Event()
        self.deliveries: list[MemoryDelivery] = []  # every delivery made, in order
        self.acked: list[DispatchMessage] = []
        self.naked: list[DispatchMessage] = []
        self.termed: list[DispatchMessage] = []
        self.fetches = 0
        self._interrupted = False

    def put(self, message: DispatchMessage) -> None:
        """A message published to the stream: delivered at the next fetch."""
        self._ready.append((self.clock(), message, 0))
        self._changed.set()

    @property
    def pending(self) -> int:
        """Messages not yet delivered, or delivered and waiting to be delivered again."""
        return len(self._ready)

    async def fetch(self, batch: int, timeout: float) -> list[MemoryDelivery]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        self.fetches += 1
        while True:
            self._expire()
            now = self.clock()
            due = [r for r in self._ready if r[0] <= now][:batch]
            if due:
                for item in due:
                    self._ready.remove(item)
                return [self._deliver(message, count + 1) for _, message, count in due]
            left = end - loop.time()
            if left <= 0 or self._interrupted:
                self._interrupted = False
                return []
            self._changed.clear()
            # Woken by a put or a nak; a delayed or expiring one is looked at again soon.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.01))

    async def reconnect(self) -> bool:
        return True

    def interrupt(self) -> None:
        """The fetch in progress returns now, empty (a test stopping the worker waits less)."""
        self._interrupted = True
        self._changed.set()

    # -- the deliveries' side ------------------------------------------------------------

    def _deliver(self, message: DispatchMessage, count: int) -> MemoryDelivery:
        delivery = MemoryDelivery(message, count, self, deadline=self._deadline())
        self.deliveries.append(delivery)
        self._out.append(delivery)
        return delivery

    def _deadline(self) -> float:
        return float("inf") if self.ack_wait is None else self.clock() + self.ack_wait

    def _settled(self, delivery: MemoryDelivery, verdict: str) -> None:
        if delivery in self._out:
            self._out.remove(delivery)
        {"ack": self.acked, "nak": self.naked, "term": self.termed}[verdict].append(
            delivery.message
        )

    def _again(self, delivery: MemoryDelivery, delay: float) -> None:
        if self.max_deliver is None or delivery.delivery_count < self.max_deliver:
            self._ready.append((self.clock() + delay, delivery.message, delivery.delivery_count))
            self._changed.set()

    def _expire(self) -> None:
        now = self.clock()
        for delivery in [d for d in self._out if d.deadline <= now]:
            self._out.remove(delivery)
            self._again(delivery, 0.0)

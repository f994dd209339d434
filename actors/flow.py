"""What the actors share: queue messages, backoff, the broker gate and probes."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from actors.domain import ClaimedRun


async def wait_for_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Wait until ``stop`` is set or ``seconds`` have passed; True when it is set.

    The pause of every loop that works, then rests for an interval: a stop
    ends the rest at once instead of after it.
    """
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


@dataclass(frozen=True)
class ClaimedBatch:
    """One message on the claimer -> dispatcher queue."""

    runs: tuple[ClaimedRun, ...]


@dataclass
class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    initial: float = 0.1
    maximum: float = 10.0
    failures: int = 0

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.maximum, self.initial * (2 ** (self.failures - 1)))
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


@dataclass
class BrokerGate:
    """Closed while this replica cannot publish, so its claimer claims nothing.

    A failed publish closes it; the runs due meanwhile are claimed by replicas
    that can publish them. It opens again on a successful publish, or when,
    after a backoff delay, ``probe`` (a round trip to the broker with a
    deadline) gets an answer; unanswered, the probe is tried again every few
    seconds at most. Only a successful publish resets the backoff: a broker
    that answers pings but refuses publishes still costs one batch per delay.
    Without a probe the gate opens after the delay alone.
    """

    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=5.0))
    probe: Probe | None = None
    probe_every: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=2.0))
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _reopen: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._open.set()

    def failed(self) -> float:
        """Close the gate; it opens after this delay at the earliest (returned)."""
        delay = self.backoff.next_delay()
        self._open.clear()
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = asyncio.get_running_loop().create_task(self._reopen_after(delay))
        return delay

    async def _reopen_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.probe_every.reset()
        while self.probe is not None and not await self.probe():
            await asyncio.sleep(self.probe_every.next_delay())
        self._open.set()

    def succeeded(self) -> None:
        self.backoff.reset()
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        self._open.set()

    async def wait_open(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def last_error(self) -> str:
        return self.probe.last_error if self.probe is not None else ""


class Probe:
    """A round trip to a server, with a deadline that holds even if the call ignores it.

    One call at a time: a call still running when its deadline passed (a
    release waiting on a silent connection, say) is cancelled and left to
    finish on its own, and the next probe waits for that same call rather
    than stacking another on the dead link.
    """

    def __init__(self, call: Callable[[], Awaitable[object]], timeout: float) -> None:
        self.call = call
        self.timeout = timeout
        self.last_error = ""
        self._task: asyncio.Future[object] | None = None

    async def __call__(self) -> bool:
        """True when the server answered within the deadline."""
        if self._task is None:
            self._task = asyncio.ensure_future(self.call())
            self._task.add_done_callback(_retrieve)
        task = self._task
        done, _ = await asyncio.wait({task}, timeout=self.timeout)
        if not done:
            task.cancel()
            self.last_error = f"no answer within {self.timeout:g}s"
            return False
        self._task = None
        if task.cancelled():
            self.last_error = "cancelled"
            return False
        error = task.exception()
        if error is not None:
            self.last_error = repr(error)[:300]
            return False
        return True


def _retrieve(task: asyncio.Future[object]) -> None:
    """An abandoned probe's outcome is read, so asyncio does not log it as lost."""
    with contextlib.suppress(asyncio.CancelledError):
        task.exception()

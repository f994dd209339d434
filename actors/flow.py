"""What the actors share: queue messages, backoff and the broker gate."""

from __future__ import annotations

import asyncio
import contextlib
import random
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
    """Closed while the broker fails, so the claimer stops claiming runs it cannot publish."""

    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=5.0))
    _open: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._open.set()

    def failed(self) -> float:
        """Close the gate for a backoff delay; returns the delay."""
        delay = self.backoff.next_delay()
        self._open.clear()
        asyncio.get_running_loop().call_later(delay, self._open.set)
        return delay

    def succeeded(self) -> None:
        self.backoff.reset()

    async def wait_open(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

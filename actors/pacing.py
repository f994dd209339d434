"""What the actors share: queue messages, backoff, the broker gate and probes."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from actors.clocks import monotonic
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
    """One message on the claimer -> dispatcher queue.

    ``trial``: the one run the claimer took to try the broker again while its
    gate was closed; the dispatcher publishes it though the gate is not open.
    """

    runs: tuple[ClaimedRun, ...]
    trial: bool = False


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

    A state machine, one outage from the first failed publish to the next
    successful one however many tries fail between: *open* (claim as usual),
    *closed* (claim nothing: the runs due meanwhile are claimed by replicas
    that can publish them), *trial* (claim one run, publish it, and stay closed
    until its outcome). A failed publish closes it for a backoff delay that
    doubles with every failure of the outage, up to ``backoff.maximum``; then
    ``probe`` (a round trip to the broker with a deadline) must get an answer,
    tried again every few seconds at most, before the trial. A broker that
    answers pings and refuses publishes (a full stream) so costs one run per
    delay, not one batch, and never resets the backoff: only a publish that
    succeeds does, and ends the outage. Without a probe the trial comes after
    the delay alone.
    """

    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=10.0))
    probe: Probe | None = None
    probe_every: Backoff = field(default_factory=lambda: Backoff(initial=0.2, maximum=2.0))
    # While an outage lasts: when it began (monotonic), the trials it took, the last error.
    outage_began: float | None = None
    trials: int = 0
    failure: str = ""
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _trial: bool = False
    _reopen: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._open.set()

    def failed(self, error: str = "") -> float:
        """Close the gate; the next trial comes after this delay at the earliest (returned)."""
        delay = self.backoff.next_delay()
        if self.outage_began is None:
            self.outage_began = monotonic()
            self.trials = 0
        self.failure = error or self.failure
        self._trial = False
        self._open.clear()
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = asyncio.get_running_loop().create_task(self._trial_after(delay))
        return delay

    async def _trial_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.probe_every.reset()
        while self.probe is not None and not await self.probe():
            await asyncio.sleep(self.probe_every.next_delay())
        self._trial = True
        self._open.set()

    def took_trial(self) -> None:
        """The claimer took its one run: closed again until the dispatcher says how it went."""
        self._trial = False
        self.trials += 1
        self._open.clear()

    def succeeded(self) -> None:
        """A publish went through: the outage (if any) is over, the backoff starts afresh."""
        self.backoff.reset()
        self.outage_began = None
        self._trial = False
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        self._open.set()

    async def wait_open(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        """Whether the claimer may claim (in a trial: one run)."""
        return self._open.is_set()

    @property
    def trial(self) -> bool:
        """Open for one run only: the outage goes on until that one is published."""
        return self._trial and self._open.is_set()

    @property
    def last_error(self) -> str:
        probed = self.probe.last_error if self.probe is not None else ""
        return self.failure or probed


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

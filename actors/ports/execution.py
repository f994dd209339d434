"""Running an attempt, and the clocks: the ports that are neither store nor broker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from actors.domain import ExecutionResult, ExecutorSpec, RunContext


class Executor(Protocol):
    """Runs one attempt and reports; never raises for a failing job."""

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult: ...

    def runs_inline(self, executor: str | None) -> bool:
        """Whether runs of that kind (a dispatch's ``executor`` hint) execute on the event
        loop (async python callables: the worker's inline pool) rather than in a slot."""
        ...


@runtime_checkable
class Preparing(Protocol):
    """An executor that can make ready ahead of time what runs of a kind need."""

    def prepare(self, executor: str | None, count: int = 1) -> None:
        """``count`` runs of that kind (a dispatch's ``executor`` hint) are coming soon
        (held for their instant): start what they need now (warm processes), not at it."""
        ...


@runtime_checkable
class Closing(Protocol):
    """An executor that holds processes of its own (the python fork server, its warm
    children): closed once the worker that used it has stopped."""

    async def close(self) -> None:
        """End what it started; what it ends is no longer running when this returns."""
        ...


class Clock(Protocol):
    """Wall-clock time, injectable so that schedules are tested without waiting."""

    def now(self) -> datetime: ...


@runtime_checkable
class MovingClock(Clock, Protocol):
    """A clock whose now() can jump (a test moved it, a skew re-measured), and says so:
    a wait computed from it is computed again (actors/worker/claimed_ahead.py)."""

    def on_moved(self, callback: Callable[[], None]) -> None: ...


class DatabaseTime(Protocol):
    """The database's clock: the one every decision about time is made on.

    Read once per tick (one round trip) and passed into the pure domain, so
    replicas whose own clocks disagree still plan the same rows.
    """

    async def read(self) -> datetime: ...


Callback = Callable[..., Awaitable[Any]]

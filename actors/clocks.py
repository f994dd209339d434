"""This process's own clocks, read in one place: the wall clock and the monotonic clock.

Time has two shapes in claimd. An instant is an aware UTC ``datetime``; the
instant that matters for runs is the database's (``actors.ports.DatabaseTime``,
``actors.scheduling.database_clock``), and this process's wall clock
(:func:`utc_now`, :class:`SystemClock`) serves only where no database is in
reach (logs, check-config, an estimate). A wait, a deadline or a duration is
measured on the monotonic clock (:func:`monotonic`, :class:`Deadline`,
:class:`Stopwatch`), which a step of the host's wall clock does not move;
asyncio's ``loop.time()`` is the same clock, so a :class:`Deadline` bounds an
``asyncio.wait`` too.

A component that tests move in time takes its clock as an argument
(``monotonic=``, ``clock=``); these are its defaults.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


def utc_now() -> datetime:
    """This process's wall clock, as an aware UTC instant."""
    return datetime.now(UTC)


def monotonic() -> float:
    """Seconds on the monotonic clock (asyncio's ``loop.time()`` reads the same)."""
    return time.monotonic()


class SystemClock:
    """The ``Clock`` port on this process's wall clock: for local use only (logs, estimates)."""

    def now(self) -> datetime:
        return utc_now()


@dataclass(frozen=True)
class Deadline:
    """An instant on the monotonic clock, ``seconds`` from when it was made."""

    at: float

    @classmethod
    def within(cls, seconds: float) -> Deadline:
        return cls(monotonic() + seconds)

    def left(self) -> float:
        """Seconds until the deadline, never below zero."""
        return max(0.0, self.at - monotonic())

    def passed(self) -> bool:
        return monotonic() >= self.at


@dataclass
class Stopwatch:
    """Time since it was started (or last restarted), on the monotonic clock."""

    began: float = field(default_factory=monotonic)

    def seconds(self) -> float:
        return monotonic() - self.began

    def elapsed(self) -> timedelta:
        return timedelta(seconds=self.seconds())

    def restart(self) -> None:
        self.began = monotonic()

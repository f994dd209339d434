"""Live output: a running attempt's printed lines, followed from any replica.

The replica executing a run publishes its output as it is read (bounded per
second); any replica's API follows it. In production on NATS core subjects
(actors/adapters/live_output.py); nothing is stored: what is kept is the tail
recorded with each attempt, as before.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class OutputChunk:
    """Text an attempt printed, in order: ``seq`` counts the chunks of one attempt.

    ``end``: the attempt's execution ended here (its verdict is being recorded).
    A snapshot (the executing replica's kept tail so far) carries the ``seq`` of the
    last chunk it includes.
    """

    attempt: int
    seq: int
    text: str = ""
    end: bool = False


class OutputFollow(Protocol):
    """One follower of one run's output."""

    async def snapshot(self, timeout: float) -> OutputChunk | None:
        """The tail printed so far by the attempt running now, from the replica running it;
        None when no replica answers within ``timeout`` (not running anywhere)."""
        ...

    async def next(self, timeout: float) -> OutputChunk | None:
        """The next chunk published, or None after ``timeout`` seconds without one."""
        ...


class OutputFeed(Protocol):
    """Where a replica's API follows runs' live output."""

    def follow(self, run_id: str) -> AbstractAsyncContextManager[OutputFollow]:
        """Subscribed on entry (chunks published from then on are kept, bounded), closed on exit."""
        ...

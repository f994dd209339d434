"""Heartbeats: a running run extends its lease and tells JetStream it is in progress.

One task per worker extends the leases of all its running runs in one
statement per beat. A run whose extension is refused (reaped, cancelled) has
lost its lease: its execution is cancelled, since a newer attempt may run.

A beat that fails because the database is away is retried at the next beat
(the lease has slack). Any other failure is a bug and is raised: the worker
stops with it, its executions are cancelled and the supervisor restarts it.
Going on without heartbeats would let the leases lapse under executions that
keep running, so another worker would run them a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
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


ExtendLeases = Callable[[Sequence[tuple[str, int]]], Awaitable[set[tuple[str, int]]]]


class Heartbeat:
    """Extends the leases of ``in_flight`` every ``interval`` until ``stop``.

    ``outage`` is the exception type that means "the server is away" (the
    worker passes ``ports.Outage``; this module sits beside the ports and does
    not import them).
    """

    def __init__(self, extend: ExtendLeases, in_flight: dict[tuple[str, int], InFlight],
                 interval: timedelta, stop: asyncio.Event, *,
                 outage: type[Exception]) -> None:
        self.extend = extend
        self.in_flight = in_flight
        self.interval = interval
        self.stop = stop
        self.outage = outage

    async def beat(self) -> None:
        entries = list(self.in_flight.values())
        if not entries:
            return
        kept = await self.extend([(e.run_id, e.epoch) for e in entries])
        for entry in entries:
            key = (entry.run_id, entry.epoch)
            if key not in self.in_flight:
                continue  # finished meanwhile
            if key in kept:
                with contextlib.suppress(Exception):
                    await entry.message.in_progress()
                continue
            if entry.task is not None and not entry.task.done():
                LEASES_LOST.inc()
                entry.lease_lost = True
                log.warning("lease lost; cancelling execution", run_id=entry.run_id,
                            job=entry.job, epoch=entry.epoch)
                entry.task.cancel()

    async def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.interval.total_seconds())
            try:
                await self.beat()
            except self.outage as exc:  # the next beat retries; the lease has slack
                log.warning("heartbeat failed", error=repr(exc))

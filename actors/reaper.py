"""The reaper: runs whose lease expired go back to pending, or fail at the attempt limit.

It must never cause the duplicates it exists to repair: the lease invariant
(checked at load) makes a lease outlive every redelivery of its message, and
heartbeats keep a live run's lease fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from actors.observability import RUNS_REAPED, get_logger
from actors.ports import RunStore

log = get_logger("reaper")
REAP_BATCH = 1000


class Reaper:
    def __init__(self, store: RunStore, interval: timedelta, stop: asyncio.Event) -> None:
        self.store = store
        self.interval = interval
        self.stop = stop

    async def reap_once(self) -> int:
        reaped = await self.store.reap_expired_leases(REAP_BATCH)
        for run_id, job, transition in reaped:
            RUNS_REAPED.labels(transition=transition).inc()
            log.warning("lease expired", run_id=run_id, job=job, transition=transition)
        return len(reaped)

    async def run(self) -> None:
        while not self.stop.is_set():
            if await self.reap_once() >= REAP_BATCH:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.interval.total_seconds())

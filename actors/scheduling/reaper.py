"""The reaper: runs whose lease expired go back to pending, or fail at the attempt limit.

It must never cause the duplicates it exists to repair: the lease invariant
(checked at load) makes a lease outlive every redelivery of its message, and
heartbeats keep a live run's lease fresh.
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta

from actors.observability import RUNS_FAILED_FINALLY, RUNS_PRUNED, RUNS_REAPED
from actors.pacing import wait_for_stop
from actors.ports import ReapingStore
from actors.scheduling.runtime import Runtime

REAP_BATCH = 1000


PRUNE_BATCH = 1000
PRUNE_EVERY = 10.0  # seconds between retention passes


@dataclass(eq=False)
class Reaper:
    """Recovers expired leases every tick; prunes history past its retention now and then."""

    store: ReapingStore
    interval: timedelta
    stop: asyncio.Event
    retention: timedelta | None = None
    _: KW_ONLY
    runtime: Runtime = field(default_factory=Runtime.local)
    _last_prune: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.log = self.runtime.logger("reaper")

    async def prune_once(self) -> int:
        """Up to a few small batches of old terminal runs; the hot path never waits on it."""
        if self.retention is None:
            return 0
        pruned = 0
        for _ in range(10):
            n = await self.store.prune_history(self.retention, PRUNE_BATCH)
            pruned += n
            if n < PRUNE_BATCH:
                break
        if pruned:
            RUNS_PRUNED.inc(pruned)
            self.log.info("history pruned", runs=pruned)
        return pruned

    async def reap_once(self) -> int:
        orphaned = await self.store.cancel_orphaned_runs()
        if orphaned:
            self.log.info("cancelled pending runs of removed jobs", runs=orphaned)
        reaped = await self.store.reap_expired_leases(REAP_BATCH)
        for run_id, job, transition in reaped:
            RUNS_REAPED.labels(transition=transition).inc()
            if transition.endswith("->failed"):
                # The last attempt's worker vanished: the run fails for good.
                RUNS_FAILED_FINALLY.labels(job).inc()
                self.log.error(
                    "lease expired",
                    run_id=run_id,
                    job=job,
                    transition=transition,
                    error="lease expired on the last attempt: the run failed",
                )
                continue
            self.log.warning("lease expired", run_id=run_id, job=job, transition=transition)
        return len(reaped)

    async def run(self) -> None:
        while not self.stop.is_set():
            if await self.reap_once() >= REAP_BATCH:
                continue
            if self.runtime.monotonic() - self._last_prune >= PRUNE_EVERY:
                self._last_prune = self.runtime.monotonic()
                await self.prune_once()
            await wait_for_stop(self.stop, self.interval.total_seconds())

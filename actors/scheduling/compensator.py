"""The compensator: releases exactly the runs that were not published back to pending.

Guarded by owner and epoch, so it can never release a run another replica
claimed since. If the database is down too, it retries with backoff; if this
process dies first, the lease expires and the reaper does the same work. Any
other error is a bug: it reaches the supervisor (retrying it forever would
stall the dispatcher behind a full queue), and the claim leases recover the runs.
"""

from __future__ import annotations

import asyncio

from actors.domain import ClaimedRun
from actors.observability import RUNS_RELEASED
from actors.pacing import Backoff
from actors.ports import ClaimingStore, Outage
from actors.scheduling.runtime import Runtime


class Compensator:
    def __init__(
        self,
        store: ClaimingStore,
        owner: str,
        inbox: asyncio.Queue[tuple[ClaimedRun, ...] | None],
        *,
        runtime: Runtime | None = None,
    ) -> None:
        self.store = store
        self.log = (runtime or Runtime.local()).logger("compensator")
        self.owner = owner
        self.inbox = inbox
        self.backoff = Backoff(initial=0.1, maximum=5.0)

    async def release(self, runs: tuple[ClaimedRun, ...]) -> int:
        while True:
            try:
                released = await self.store.release_unpublished(self.owner, runs)
            except Outage as exc:  # retried; the lease is the backstop
                delay = self.backoff.next_delay()
                self.log.warning(
                    "release failed; retrying",
                    runs=len(runs),
                    delay_s=round(delay, 3),
                    error=repr(exc),
                )
                await asyncio.sleep(delay)
                continue
            self.backoff.reset()
            RUNS_RELEASED.inc(released)
            self.log.info(
                "released unpublished runs", runs=released, run_ids=[r.run_id for r in runs][:20]
            )
            return released

    async def run(self) -> None:
        while (runs := await self.inbox.get()) is not None:
            await self.release(runs)

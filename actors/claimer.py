"""The claimer: claims disjoint batches of due runs with one statement, under a lease."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from actors.flow import BrokerGate, ClaimedBatch
from actors.observability import RUNS_CLAIMED, RUNS_SKIPPED, get_logger
from actors.ports import RunStore

log = get_logger("claimer")


class Claimer:
    """Claims while claimed-but-not-started runs stay under ``max_claimed``."""

    def __init__(self, store: RunStore, owner: str, outbox: asyncio.Queue[ClaimedBatch | None],
                 gate: BrokerGate, *, batch: int, lease: timedelta, max_claimed: int,
                 interval: timedelta, stop: asyncio.Event) -> None:
        self.store = store
        self.owner = owner
        self.outbox = outbox
        self.gate = gate
        self.batch = batch
        self.lease = lease
        self.max_claimed = max_claimed
        self.interval = interval
        self.stop = stop

    async def claim_once(self) -> int:
        for run_id, reason in await self.store.skip_unrunnable(self.batch):
            RUNS_SKIPPED.inc()
            log.info("run skipped", run_id=run_id, reason=reason)
        runs = await self.store.claim_due_runs(self.owner, self.batch, self.lease,
                                               self.max_claimed)
        if runs:
            RUNS_CLAIMED.inc(len(runs))
            await self.outbox.put(ClaimedBatch(tuple(runs)))
        return len(runs)

    async def run(self) -> None:
        while not self.stop.is_set():
            if not self.gate.is_open:
                # The broker is failing: claiming now would only feed the compensator.
                await self._until_stop_or(self.gate.wait_open())
                continue
            claimed = await self.claim_once()
            if claimed < self.batch:
                await self._until_stop_or(asyncio.sleep(self.interval.total_seconds()))

    async def _until_stop_or(self, other: Coroutine[Any, Any, object]) -> None:
        """Wait for ``other`` or the stop event, whichever comes first."""
        tasks = {asyncio.ensure_future(self.stop.wait()), asyncio.ensure_future(other)}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

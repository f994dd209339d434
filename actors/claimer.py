"""The claimer: claims disjoint batches of due runs with one statement, under a lease.

It claims only what this replica can publish: while the broker gate is closed
(publishes failing, and no answer yet to the gate's probe) it claims nothing,
and the runs due meanwhile are claimed by the other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from actors.flow import BrokerGate, ClaimedBatch
from actors.observability import (
    INTAKE_PAUSED,
    INTAKE_PAUSES,
    RUNS_CLAIMED,
    RUNS_SKIPPED,
    get_logger,
)
from actors.ports import RunStore

log = get_logger("claimer")


class Claimer:
    """Claims while claimed-but-not-started runs stay under ``max_claimed``."""

    def __init__(
        self,
        store: RunStore,
        owner: str,
        outbox: asyncio.Queue[ClaimedBatch | None],
        gate: BrokerGate,
        *,
        batch: int,
        lease: timedelta,
        max_claimed: int,
        interval: timedelta,
        stop: asyncio.Event,
    ) -> None:
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
        runs = await self.store.claim_due_runs(self.owner, self.batch, self.lease, self.max_claimed)
        if runs:
            RUNS_CLAIMED.inc(len(runs))
            await self.outbox.put(ClaimedBatch(tuple(runs)))
        return len(runs)

    async def run(self) -> None:
        while not self.stop.is_set():
            if not self.gate.is_open:
                # The broker is failing: claiming now would only feed the compensator.
                await self._while_gate_closed()
                continue
            claimed = await self.claim_once()
            if claimed < self.batch:
                await self._until_stop_or(asyncio.sleep(self.interval.total_seconds()))

    async def _while_gate_closed(self) -> None:
        INTAKE_PAUSED.labels(actor="claimer").set(1)
        INTAKE_PAUSES.labels(actor="claimer", reason="broker").inc()
        began = time.monotonic()
        log.warning(
            "claiming paused: this replica cannot publish; others claim", error=self.gate.last_error
        )
        try:
            await self._until_stop_or(self.gate.wait_open())
        finally:
            INTAKE_PAUSED.labels(actor="claimer").set(0)
        if not self.stop.is_set():
            log.info(
                "claiming resumed: the broker answers", paused_s=round(time.monotonic() - began, 3)
            )

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

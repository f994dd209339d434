"""The claimer: claims disjoint batches of due runs with one statement, under a lease.

It claims only what this replica can publish: while the broker gate is closed
(publishes failing, and no answer yet to the gate's probe) it claims nothing,
and the runs due meanwhile are claimed by the other replicas. After each of
the gate's backoff delays it claims one run to try the broker again: a broker
that answers pings and refuses publishes (a full stream) costs one failed
publish per delay, not a batch claimed, refused and released in a loop. The
pause and the resume are one warning each per outage.

It claims runs due within ``ahead`` (``claim_ahead``) too: their worker holds
them until their instant (actors/worker/claimed_ahead.py). With ``wake`` it does not wait out
its ``interval`` when a run is due sooner: it reads the next due instant from
the database before each pass and rests only until then (less ``ahead``), and
:meth:`Claimer.run_pending` (the LISTEN/NOTIFY listener calls it) cuts a rest
short for a run that became pending and is due before the rest ends. The
interval remains the poll that catches what no wake announced.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from actors.observability import (
    INTAKE_PAUSED,
    INTAKE_PAUSES,
    RUNS_CLAIMED,
    RUNS_SKIPPED,
)
from actors.pacing import BrokerGate, ClaimedBatch
from actors.ports import ClaimingStore
from actors.scheduling.runtime import Runtime

HERD_GROWTH = 4  # a pass claims at most this many batches (after full passes)


@dataclass(eq=False)
class Claimer:
    """Claims while claimed-but-not-started runs stay under ``max_claimed``.

    ``runtime``: the replica's (actors.scheduling.runtime); its database clock's
    estimate compares notified instants.
    """

    store: ClaimingStore
    owner: str
    outbox: asyncio.Queue[ClaimedBatch | None]
    gate: BrokerGate
    _: KW_ONLY
    batch: int
    lease: timedelta
    max_claimed: int
    interval: timedelta
    stop: asyncio.Event
    ahead: timedelta = timedelta(0)
    wake: bool = False
    runtime: Runtime = field(default_factory=Runtime.local)
    _woken: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _rest_until: datetime | None = field(default=None, init=False)  # None: not resting
    # monotonic, while the gate's outage lasts
    _paused_since: float | None = field(default=None, init=False)
    _limit: int = field(default=0, init=False)  # the next pass's; 0: ``batch``

    def __post_init__(self) -> None:
        self.clock = self.runtime.database.now
        self.log = self.runtime.logger("claimer")

    async def claim_once(self, limit: int | None = None, *, trial: bool = False) -> int:
        """One pass: skip what may not run, claim up to ``limit`` (the batch) and send it on."""
        limit = self.batch if limit is None else limit
        for run_id, reason in await self.store.skip_unrunnable(self.batch):
            RUNS_SKIPPED.inc()
            self.log.info("run skipped", run_id=run_id, reason=str(reason))
        runs = await self.store.claim_due_runs(
            self.owner, limit, self.lease, self.max_claimed, self.ahead
        )
        if runs:
            RUNS_CLAIMED.inc(len(runs))
            if trial:
                self.gate.took_trial()
            await self.outbox.put(ClaimedBatch(tuple(runs), trial=trial))
        return len(runs)

    async def run(self) -> None:
        while not self.stop.is_set():
            self._said_resumed()
            if not self.gate.is_open:
                # The broker is failing: claiming now would only feed the compensator.
                await self._while_gate_closed()
                continue
            self._woken.clear()
            # A trial claims one run: a broker that still refuses costs one failed publish.
            trial = self.gate.trial
            limit = 1 if trial else (self._limit or self.batch)
            # Read before the claim: a run due between this read and the claim is
            # claimed now, and at worst wakes one pass that finds nothing.
            next_due = await self.store.next_due_in(self.ahead) if self.wake else None
            claimed = await self.claim_once(limit, trial=trial)
            if claimed < limit:
                self._limit = 0
                await self._rest(self._rest_for(next_due))
            elif not trial:
                self._limit = self._grown(limit)

    def _grown(self, limit: int) -> int:
        """The next pass's limit after a full one: twice as many, within the bounds.

        Bounded by ``HERD_GROWTH`` batches and a quarter of ``max_claimed``
        (never below ``batch``): replicas claiming at once overshoot the
        in-flight bound by at most (replicas - 1) x the limit.
        """
        most = max(self.batch, min(self.batch * HERD_GROWTH, self.max_claimed // 4))
        return min(limit * 2, most)

    def _rest_for(self, next_due: timedelta | None) -> float:
        """Seconds to rest: the interval, or less when the next run is due sooner."""
        rest = self.interval.total_seconds()
        if next_due is not None:
            # A millisecond past the moment it becomes claimable, not just before.
            rest = min(rest, max(0.0, (next_due - self.ahead).total_seconds()) + 0.001)
        return rest

    def run_pending(self, due_at: datetime) -> None:
        """A run became pending, due at ``due_at``: wake now if that is before the rest ends.

        While a pass is under way, it wakes the next rest at once: the pass may
        have read the next due instant before the run was written.
        """
        until = self._rest_until
        if until is None or due_at - self.ahead < until:
            self._woken.set()

    async def _rest(self, seconds: float) -> None:
        """Until ``seconds`` pass, a run due sooner is announced, or the stop."""
        if self._woken.is_set():
            return
        self._rest_until = self.clock() + timedelta(seconds=seconds)
        try:
            await self._until_stop_or(self._woken_within(seconds))
        finally:
            self._rest_until = None

    async def _woken_within(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), seconds)

    async def _while_gate_closed(self) -> None:
        """Wait for the gate; said once per outage, however many trials it takes."""
        if self._paused_since is None:
            self._paused_since = self.runtime.monotonic()
            INTAKE_PAUSED.labels(actor="claimer").set(1)
            INTAKE_PAUSES.labels(actor="claimer", reason="broker").inc()
            self.log.warning(
                "claiming paused: this replica cannot publish; others claim. Backing off, "
                "one run tried after each delay",
                error=self.gate.last_error,
                max_delay_s=self.gate.backoff.maximum,
            )
        await self._until_stop_or(self.gate.wait_open())

    def _said_resumed(self) -> None:
        """The outage is over (a publish went through): said once, with what it cost."""
        if self._paused_since is None or self.gate.outage_began is not None:
            return
        INTAKE_PAUSED.labels(actor="claimer").set(0)
        self.log.warning(
            "claiming resumed: publishes go through again",
            paused_s=round(self.runtime.monotonic() - self._paused_since, 3),
            trials=self.gate.trials,
        )
        self._paused_since = None

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

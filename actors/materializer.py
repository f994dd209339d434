"""The materializer: expands each enabled job's schedule into rows up to a horizon ahead.

Idempotent by ``UNIQUE (job_id, scheduled_at)``: several replicas may run it at
once and the second insert of an instant changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from datetime import timedelta

from actors.domain import Job, Plan, plan_materialization
from actors.observability import RUNS_MATERIALIZED, RUNS_MISSED, get_logger
from actors.ports import Clock, RunStore

log = get_logger("materializer")


class Materializer:
    """Writes the rows the schedules say are due, every tick."""

    def __init__(self, store: RunStore, jobs: Callable[[], Mapping[str, Job]], clock: Clock,
                 horizon: timedelta, interval: timedelta, stop: asyncio.Event) -> None:
        self.store = store
        self.jobs = jobs
        self.clock = clock
        self.horizon = horizon
        self.interval = interval
        self.stop = stop

    async def tick(self) -> int:
        """Materialize once; returns the number of rows inserted."""
        states = await self.store.active_jobs()
        now = self.clock.now()
        plans: list[tuple[int, Plan]] = []
        for name, job in self.jobs().items():
            state = states.get(name)
            if state is None or state.paused or not job.enabled:
                continue
            plan = plan_materialization(job, state.materialized_until, now, self.horizon)
            if plan.missed:
                RUNS_MISSED.labels(job=name).inc(plan.missed)
                log.warning("missed instants dropped by catch-up policy", job=name,
                            missed=plan.missed, catchup=job.catchup.value)
            if plan.runs or plan.materialized_until != state.materialized_until:
                plans.append((state.id, plan))
        if not plans:
            return 0
        inserted = await self.store.materialize_many(plans)
        RUNS_MATERIALIZED.inc(inserted)
        if inserted:
            log.debug("materialized", runs=inserted, jobs=len(plans))
        return inserted

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.interval.total_seconds())

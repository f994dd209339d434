"""The materializer: expands each enabled job's schedule into rows up to a horizon ahead.

Idempotent by ``UNIQUE (job_id, scheduled_at)``: several replicas may run it at
once and the second insert of an instant changes nothing. It plans from the
definitions stored in ``jobs`` (what the last sync or reload wrote), never from
a replica's own copy of the config file, so replicas that reloaded at
different moments still plan the same instants.

It plans on the database's clock, read once per tick, never on the replica's
own: with a replica minutes ahead or behind, the instants it calls past or
future, and where a new job starts, are the same as on every other replica.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from actors.domain import DecodedJobs, Job, Plan, plan_materialization
from actors.flow import wait_for_stop
from actors.observability import RUNS_MATERIALIZED, RUNS_MISSED, get_logger
from actors.ports import DatabaseTime, JobState, RunStore

log = get_logger("materializer")


# The least lateness an instant may have when first planned and still be on
# time rather than missed: a job's first tick after it was added, or a tick
# that came a little late, must not drop instants under catchup latest/none.
MIN_ON_TIME = timedelta(seconds=5)
# How far ahead a job's next instant is looked for when its plan was empty.
FAR_AHEAD = timedelta(days=400)


class Materializer:
    """Writes the rows the schedules say are due, every tick."""

    def __init__(
        self,
        store: RunStore,
        clock: DatabaseTime,
        horizon: timedelta,
        interval: timedelta,
        stop: asyncio.Event,
        *,
        guard_stale_plans: bool = True,
    ) -> None:
        """``clock`` is the database's (tests may move a fake one, and then turn
        ``guard_stale_plans`` off: the database's own now() cannot agree with it)."""
        self.store = store
        self._decoded = DecodedJobs()  # each stored definition decoded once
        self.clock = clock
        self.horizon = horizon
        self.interval = interval
        self.stop = stop
        self.on_time = max(MIN_ON_TIME, 2 * interval)
        self.guard_stale_plans = guard_stale_plans
        # Per job: (fingerprint, high-water mark, the first instant after it).
        self._next: dict[str, tuple[str, datetime, datetime | None]] = {}

    async def tick(self) -> int:
        """Materialize once; returns the number of rows inserted."""
        # One clock for the whole tick, the database's, read before the jobs:
        # a plan made from it and written a moment later is never ahead of
        # the database, so it never drops an instant a fresher plan keeps.
        now = await self.clock.read()
        states = await self.store.active_jobs()
        plans: list[tuple[JobState, Plan]] = []
        for state in states.values():
            if state.paused:
                continue
            if self._nothing_to_plan(state, now):
                continue
            job = self._job(state)
            if job is None:
                continue
            plan = plan_materialization(
                job,
                state.materialized_until,
                now,
                self.horizon,
                first_seen=state.created_at,
                on_time=self.on_time,
            )
            if plan.runs or plan.missed or self._mark_due(state, plan, now):
                plans.append((state, plan))
            elif state.materialized_until is not None:
                self._remember_next(state, job)
        if not plans:
            return 0
        # A plan that reaches the database later than its on-time tolerance
        # writes nothing (it would keep instants that are missed by then).
        fresh_until = now + self.on_time if self.guard_stale_plans else None
        written = await self.store.materialize_many(plans, fresh_until)
        RUNS_MATERIALIZED.inc(written.runs)
        if written.runs:
            log.debug("materialized", runs=written.runs, jobs=len(plans))
        # Counted as recorded, not as planned: replicas planning the same
        # dropped instants count them once between them (the first records
        # the gap), and a plan that wrote nothing counts nothing.
        for state, _ in plans:
            if missed := written.missed.get(state.id, 0):
                RUNS_MISSED.labels(state.name).inc(missed)
                job = self._job(state)  # decoded when planned: a lookup here
                log.warning(
                    "missed instants dropped by catch-up policy",
                    job=state.name,
                    missed=missed,
                    catchup=job.catchup.value if job else None,
                )
        return written.runs

    def _nothing_to_plan(self, state: JobState, now: datetime) -> bool:
        """True when this tick's plan for the job would be empty and keep its mark.

        That is: the mark stays (see ``_mark_due``) and the job's first instant
        after it, remembered from an earlier tick with the same definition and
        mark, is beyond now + horizon. A tick then costs a comparison per job
        instead of a plan (10,000 jobs: most of them, most ticks).
        """
        mark = state.materialized_until
        known = self._next.get(state.name)
        if mark is None or known is None or known[:2] != (state.fingerprint, mark):
            return False
        if mark < now + self.horizon / 2:
            return False
        following, until = known[2], now + self.horizon
        if following is None:  # none within FAR_AHEAD of the mark
            return until < mark + FAR_AHEAD
        return following > until

    def _remember_next(self, state: JobState, job: Job) -> None:
        mark = state.materialized_until
        assert mark is not None
        following = next(iter(job.schedule.fire_times(mark, mark + FAR_AHEAD)), None)
        self._next[state.name] = (state.fingerprint, mark, following)

    def _mark_due(self, state: JobState, plan: Plan, now: datetime) -> bool:
        """Whether a plan with no instant to write still moves the high-water mark.

        Only once the mark is less than half the horizon ahead of now. Moving
        it every tick rewrote every job row every second (10,000 jobs: 10,000
        row versions a second), which bloated ``jobs`` for every statement
        that reads it. Holding it back changes no plan: nothing is due between
        the mark and now + horizon (else the plan would have runs), and the
        mark stays ahead of now, so no instant after it is past or missed.
        """
        mark = state.materialized_until
        if plan.materialized_until == mark:
            return False
        return mark is None or mark < now + self.horizon / 2

    def _job(self, state: JobState) -> Job | None:
        try:
            return self._decoded.job(state.name, state.fingerprint, state.definition)
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the others
            log.error("stored job definition unreadable; skipped", job=state.name, error=repr(exc))
            return None

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.tick()
            await wait_for_stop(self.stop, self.interval.total_seconds())

"""The materializer: expands each enabled job's schedule into rows up to a horizon ahead.

Idempotent by ``UNIQUE (job_id, scheduled_at)``: several replicas may run it at
once and the second insert of an instant changes nothing. It plans from the
definitions stored in ``jobs`` (what the last sync or reload wrote), never from
a replica's own copy of the config file, so replicas that reloaded at
different moments still plan the same instants.

It plans on the database's clock, never on the replica's own: with a replica
minutes ahead or behind, the instants it calls past or future, and where a new
job starts, are the same as on every other replica.

Its cost follows the instants entering the horizon, not the jobs that exist.
It keeps every job it plans in memory with the moment the job is next due for
planning (its next instant minus the horizon), in a heap: a tick pops the jobs
whose moment has come and costs nothing for the others. The catalog is read
again only when its version moves (a sync, a reload, a pause: sql/0009). A
job's high-water mark is written just before its next instant, so a daily job
is written once a day. Several replicas plan the same jobs; a write from a mark
another replica has moved since is refused and answered with the mark now, so
only one of them writes each plan. A write refused because a sync removed or
redefined the job since the catalog was read is answered as superseded: the
job is forgotten and the catalog read again before the next chunk.

Planning never holds the event loop for long: jobs are planned in slices that
yield, and written in chunks of their own, each planned from a fresh read of
the database's clock. A chunk the database finds stale (a stalled process)
writes nothing, is counted and logged, and is planned again at once. Ticks
keep out of the seconds around an instant that many runs share (a herd): the
claimer and the workers have those seconds to themselves.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from actors.domain import (
    MIN_ON_TIME,
    DecodedJobs,
    Job,
    Plan,
    next_plan,
    plan_materialization,
)
from actors.observability import (
    PLANNING_BEHIND,
    PLANNING_JOBS,
    PLANS_DISCARDED,
    RUNS_MATERIALIZED,
    RUNS_MISSED,
)
from actors.pacing import wait_for_stop
from actors.ports import DatabaseTime, JobState, PlanningStore
from actors.scheduling.runtime import Runtime

# Jobs planned and written together: one statement of a few thousand rows.
CHUNK_JOBS = 2_000
# Planning yields to the event loop after this much work (seconds of CPU).
SLICE_SECONDS = 0.005
# An instant with at least this many runs planned is a herd: ticks keep out of
# the seconds around it (from `quiet_before` before it to HERD_QUIET_AFTER after).
HERD_RUNS = 200
HERD_QUIET_AFTER = timedelta(seconds=4)
# A tick waits out a herd only while its oldest due job can wait this long.
MAX_POSTPONE = timedelta(seconds=15)


@dataclass
class _Planned:
    """What the materializer keeps per job: the row it read, the job, when it is due."""

    state: JobState
    job: Job
    due: datetime  # when the job must next be planned (its next instant - horizon)


class Materializer:
    """Writes the rows the schedules say are due, every tick."""

    def __init__(
        self,
        store: PlanningStore,
        clock: DatabaseTime,
        horizon: timedelta,
        interval: timedelta,
        stop: asyncio.Event,
        *,
        guard_stale_plans: bool = True,
        quiet_before: timedelta = timedelta(seconds=3),
        config_jobs: Callable[[], Mapping[str, Job]] = dict,
        runtime: Runtime | None = None,
    ) -> None:
        """``clock`` is the database's (tests may move a fake one, and then turn
        ``guard_stale_plans`` off: the database's own now() cannot agree with it).
        ``quiet_before``: how long before a herd's instant ticks stop (the
        claimer's claim-ahead and a margin). ``config_jobs``: this replica's jobs as
        its config has them now, used in place of a stored definition that is the
        same (one decode less per job). ``runtime``: the replica's, for the logger."""
        self.log = (runtime or Runtime.local()).logger("materializer")
        self._config_jobs = config_jobs
        self.store = store
        self._decoded = DecodedJobs(size=0)  # each stored definition decoded once
        self.clock = clock
        self.horizon = horizon
        self.interval = interval
        self.stop = stop
        self.on_time = max(MIN_ON_TIME, 2 * interval)
        self.guard_stale_plans = guard_stale_plans
        self.quiet_before = quiet_before
        self._jobs: dict[int, _Planned] = {}
        self._heap: list[tuple[datetime, int]] = []  # (due, job id); stale entries skipped
        self._version: int | None = None
        self._herds: dict[datetime, int] = {}  # instant -> runs planned at it
        self._behind = timedelta(0)  # the latest a job of this tick was planned
        self._warned_behind = False

    # -- one tick ----------------------------------------------------------------------

    async def tick(self) -> int:
        """Materialize what is due once; returns the number of rows inserted."""
        now = await self.clock.read()
        await self._refresh_catalog()
        now = await self._keep_out_of_herds(now)
        written, self._behind = 0, timedelta(0)
        while due := self._pop_due(now, CHUNK_JOBS):
            try:
                runs = await self._plan_and_write(due, now)
            except BaseException:
                self._put_back(due, now)
                raise
            if runs is None or self.stop.is_set():
                break  # a stale chunk: the next tick plans it again, on a fresh clock
            written += runs
            now = await self.clock.read()
            if self._version is None:  # a plan was superseded by a reload: read it now
                await self._refresh_catalog()
        self._report_behind()
        return written

    async def _plan_and_write(self, due: list[_Planned], now: datetime) -> int | None:
        """Plan one chunk of jobs from ``now`` and write it; the rows written, None if stale."""
        plans = await self._plan(due, now)
        if not plans:
            return 0
        # A plan that reaches the database later than its on-time tolerance
        # writes nothing (it would keep instants that are missed by then).
        fresh_until = now + self.on_time if self.guard_stale_plans else None
        written = await self.store.materialize_many(plans, fresh_until)
        if written.stale:
            PLANS_DISCARDED.inc()
            self.log.warning(
                "plan reached the database after its on-time tolerance; planning it again",
                jobs=len(plans),
                tolerance_s=self.on_time.total_seconds(),
            )
            for state, _ in plans:
                self._again(state.id, state.materialized_until, now)
            return None
        by_id = {state.id: (state, plan) for state, plan in plans}
        for job_id in written.written:
            plan = by_id[job_id][1]
            self._again(job_id, plan.materialized_until, None)
            self._count_herds(plan, plan.materialized_until)
        for job_id, current in written.moved.items():
            self._again(job_id, current, now)  # another replica planned it: from its mark
            self._count_herds(by_id[job_id][1], current)  # it wrote them up to that mark
        if written.superseded:
            # Removed or redefined by a sync since the catalog was read: planned
            # again from this copy it would be refused again, and a tick that
            # kept doing so never ended, never read the catalog, and left the
            # sync's added and changed jobs unplanned (issue 17). They are
            # forgotten, and the catalog is read again before the next chunk.
            for job_id in written.superseded:
                self._jobs.pop(job_id, None)
            self._version = None
        RUNS_MATERIALIZED.inc(written.runs)
        if written.runs:
            self.log.debug("materialized", runs=written.runs, jobs=len(written.written))
        # Counted as recorded, not as planned: replicas planning the same
        # dropped instants count them once between them (the first records
        # the gap), and a plan that wrote nothing counts nothing.
        for job_id, missed in written.missed.items():
            job = by_id[job_id][0]
            RUNS_MISSED.labels(job.name).inc(missed)
            self.log.warning(
                "missed instants dropped by catch-up policy",
                job=job.name,
                missed=missed,
                catchup=self._jobs[job_id].job.catchup.value if job_id in self._jobs else None,
            )
        return written.runs

    async def _plan(self, due: list[_Planned], now: datetime) -> list[tuple[JobState, Plan]]:
        """The plans of the jobs with something to write; the others due at their next instant.

        Yields to the event loop every SLICE_SECONDS of work.
        """
        plans: list[tuple[JobState, Plan]] = []
        began = time.process_time()
        for planned in due:
            if planned.due is not _EARLIEST:
                self._behind = max(self._behind, now - planned.due)
            plan = plan_materialization(
                planned.job,
                planned.state.materialized_until,
                now,
                self.horizon,
                first_seen=planned.state.created_at,
                on_time=self.on_time,
            )
            mark = plan.materialized_until
            if plan.runs or plan.missed or self._mark_behind(planned.state, mark, now):
                ahead = next_plan(planned.job, mark)
                plans.append((planned.state, replace(plan, materialized_until=ahead.mark)))
            else:  # the mark already covers the horizon
                self._due_at(planned, planned.state.materialized_until)
            if time.process_time() - began > SLICE_SECONDS:
                await asyncio.sleep(0)  # starts, heartbeats and completions go first
                began = time.process_time()
        return plans

    def _count_herds(self, plan: Plan, written_until: datetime | None) -> None:
        """Count the plan's runs at or before ``written_until`` (the rows now stored).

        Counted once the write is answered, not when planned: a stale chunk is
        planned again, and counting it each time would make herds of instants
        that are not.
        """
        if written_until is None:
            return
        for run in plan.runs:
            if run.scheduled_at <= written_until:
                self._herds[run.scheduled_at] = self._herds.get(run.scheduled_at, 0) + 1

    def _mark_behind(self, state: JobState, mark: datetime, now: datetime) -> bool:
        """Whether a plan with no instant to write must still write its mark.

        A job never planned, or whose mark is behind now + horizon: its mark
        then moves to just before its next instant (next_plan), so it stays
        ahead of now until that instant and is written once per instant, not
        every tick (10,000 jobs wrote 10,000 row versions a second once).
        """
        current = state.materialized_until
        return current is None or (current < now + self.horizon and mark != current)

    def _again(self, job_id: int, mark: datetime | None, now: datetime | None) -> None:
        """The job's mark is ``mark`` now; due again at ``now`` (plan at once) or after it."""
        planned = self._jobs.get(job_id)
        if planned is None:
            return
        planned.state = replace(planned.state, materialized_until=mark)
        if now is not None:
            planned.due = now
            heapq.heappush(self._heap, (now, job_id))
        else:
            self._due_at(planned, mark)

    def _due_at(self, planned: _Planned, mark: datetime | None) -> None:
        """Due for planning when the job's next instant after ``mark`` enters the horizon."""
        if mark is None:
            return
        ahead = next_plan(planned.job, mark)
        instant = ahead.mark if ahead.instant is None else ahead.instant
        planned.due = instant - self.horizon
        heapq.heappush(self._heap, (planned.due, planned.state.id))

    def _put_back(self, due: list[_Planned], now: datetime) -> None:
        """The chunk whose planning failed, due again at ``now``.

        An outage or a crash: the supervisor restarts this same materializer,
        and a job left out of the heap would never be planned by it again.
        """
        for planned in due:
            if planned.due is _NEVER and self._jobs.get(planned.state.id) is planned:
                planned.due = now
                heapq.heappush(self._heap, (now, planned.state.id))

    def _pop_due(self, now: datetime, limit: int) -> list[_Planned]:
        """Up to ``limit`` jobs whose planning moment has come, oldest first."""
        out: list[_Planned] = []
        while self._heap and self._heap[0][0] <= now and len(out) < limit:
            due, job_id = heapq.heappop(self._heap)
            planned = self._jobs.get(job_id)
            if planned is None or planned.due != due or planned.state.paused:
                continue  # superseded entry, removed or paused job
            planned.due = _NEVER  # out of the heap until planned
            out.append(planned)
        return out

    # -- the catalog -------------------------------------------------------------------

    async def _refresh_catalog(self) -> None:
        """Read every job again when the catalog's version moved; keep what is unchanged."""
        version = await self.store.catalog_version()
        if version == self._version:
            return
        states = await self.store.active_jobs()
        self._version = version
        kept: dict[int, _Planned] = {}
        for state in states.values():
            old = self._jobs.get(state.id)
            if old is not None and _same(old.state, state):
                kept[state.id] = old
                continue
            job = self._job(state)
            if job is None:
                continue
            # The definition text is decoded into `job`: not kept twice per job.
            planned = _Planned(replace(state, definition=""), job, _NEVER)
            kept[state.id] = planned
            if not state.paused:  # new, edited, resumed or moved: plan it at once
                planned.due = _EARLIEST
                heapq.heappush(self._heap, (planned.due, state.id))
        self._jobs = kept
        self._decoded.keep({(p.state.name, p.state.fingerprint) for p in kept.values()})
        PLANNING_JOBS.set(len(kept))

    def _job(self, state: JobState) -> Job | None:
        # The replica's own config job, where it is the stored definition (same
        # name and fingerprint): 100,000 stored definitions decoded again were
        # most of a first catalog read (bench_config_scale).
        own = self._config_jobs().get(state.name)
        if own is not None and own.enabled and own.fingerprint() == state.fingerprint:
            return own
        try:
            return self._decoded.job(state.name, state.fingerprint, state.definition)
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the others
            self.log.error(
                "stored job definition unreadable; skipped", job=state.name, error=repr(exc)
            )
            return None

    # -- herds and lateness ------------------------------------------------------------

    async def _keep_out_of_herds(self, now: datetime) -> datetime:
        """Wait out the seconds around a herd's instant, if the due jobs can wait."""
        for instant in [t for t in self._herds if t < now - HERD_QUIET_AFTER]:
            del self._herds[instant]
        herd = min(
            (
                t
                for t, runs in self._herds.items()
                if runs >= HERD_RUNS and t - self.quiet_before <= now <= t + HERD_QUIET_AFTER
            ),
            default=None,
        )
        if herd is None or not self._heap or self._heap[0][0] > now:
            return now
        quiet_until = herd + HERD_QUIET_AFTER
        if quiet_until - self._heap[0][0] > MAX_POSTPONE:
            return now  # the oldest due job cannot wait that long
        await wait_for_stop(self.stop, (quiet_until - now).total_seconds())
        return await self.clock.read()

    def _report_behind(self) -> None:
        """The gauge, and one warning when planning falls behind (one more when it recovers).

        Behind: a job planned later than its moment (its next instant minus the
        horizon) by more than a quarter of the horizon. Its instants are still
        planned before they are due while that is under the horizon.
        """
        PLANNING_BEHIND.set(self._behind.total_seconds())
        late = self._behind > self.horizon / 4
        if late and not self._warned_behind:
            self.log.warning(
                "materializer falling behind: jobs planned late",
                behind_s=round(self._behind.total_seconds(), 1),
                horizon_s=self.horizon.total_seconds(),
                jobs=len(self._jobs),
            )
        elif not late and self._warned_behind:
            self.log.info("materializer keeping up again", jobs=len(self._jobs))
        self._warned_behind = late

    async def run(self) -> None:
        while not self.stop.is_set():
            await self.tick()
            await wait_for_stop(self.stop, self.interval.total_seconds())


_EARLIEST = datetime.min.replace(tzinfo=UTC)  # a job to plan at once
_NEVER = datetime.max.replace(tzinfo=UTC)  # a job out of the heap (being planned, paused)


def _same(old: JobState, new: JobState) -> bool:
    """The same job as planned: definition, pause and mark (another replica may move it)."""
    return (old.fingerprint, old.paused, old.materialized_until) == (
        new.fingerprint,
        new.paused,
        new.materialized_until,
    )

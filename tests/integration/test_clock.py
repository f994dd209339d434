"""One clock, on the real database: materializers on hosts 10 minutes apart plan the same rows.

Each materializer reads PostgreSQL's now() through a DatabaseClock whose local
clock is shifted; the rows they write together are exactly the instants from
each job's creation up to the database's now plus the horizon, and the skew each
measured is its shift. A plan that reaches the database after its on-time
tolerance writes nothing and leaves the mark where it was.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from actors.adapters.postgres import PostgresRunStore
from actors.domain import Catchup, IntervalSchedule, Job, PythonSpec, plan_materialization
from actors.scheduling.database_clock import DatabaseClock
from actors.scheduling.materializer import Materializer

pytestmark = pytest.mark.integration

HORIZON = timedelta(minutes=2)


class ShiftedClock:
    """A host whose wall clock is ``offset`` off."""

    def __init__(self, offset: timedelta) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


def _job(name: str, every_s: int, catchup: Catchup, window: timedelta) -> Job:
    return Job(
        name=name,
        schedule=IntervalSchedule(timedelta(seconds=every_s)),
        executor=PythonSpec("tests.integration.helpers:record_call"),
        catchup=catchup,
        catchup_window=window,
    )


JOBS = [_job(f"{c.value}-{w}", 1, c, timedelta(minutes=w)) for c in Catchup for w in (1, 60)]


def _missed() -> float:
    return sum(
        REGISTRY.get_sample_value("claimd_runs_missed_total", {"claimd_job": j.name}) or 0.0
        for j in JOBS
    )


async def test_materializers_ten_minutes_apart_plan_one_set_of_rows(
    store: PostgresRunStore,
) -> None:
    offsets = [timedelta(minutes=10), -timedelta(minutes=10), timedelta(0)]
    clocks = [DatabaseClock(store, local=ShiftedClock(o)) for o in offsets]
    materializers = [
        Materializer(store, c, HORIZON, timedelta(milliseconds=500), asyncio.Event())
        for c in clocks
    ]
    missed_before = _missed()
    await store.sync_jobs(JOBS[:3])  # the first jobs exist before any tick
    for round_ in range(6):
        if round_ == 3:
            await store.sync_jobs(JOBS)  # first seen between ticks
        for m in materializers:  # the skewed replicas tick first each round
            await m.tick()

    for clock, offset in zip(clocks, offsets, strict=True):
        assert abs(clock.skew - offset) < timedelta(seconds=1)
    now = await store.database_now()
    rows = await store.pool.fetch(
        "SELECT j.name, j.created_at, j.materialized_until, array_agg(r.scheduled_at "
        "ORDER BY r.scheduled_at) AS instants FROM jobs j JOIN job_runs r ON r.job_id = j.id "
        "GROUP BY j.name, j.created_at, j.materialized_until"
    )
    assert {r["name"] for r in rows} == {j.name for j in JOBS}
    for r in rows:
        born, mark = r["created_at"], r["materialized_until"]
        # The mark is the database's now plus the horizon (then just before the
        # job's next instant, a second later at most), not a skewed host's.
        assert now < mark < now + HORIZON + timedelta(seconds=1), r["name"]
        first = born.replace(microsecond=0) + timedelta(seconds=1)
        expected = [
            first + timedelta(seconds=i) for i in range(int((mark - first).total_seconds()) + 1)
        ]
        assert r["instants"] == [t for t in expected if t <= mark], r["name"]
    assert _missed() == missed_before


async def test_a_plan_that_reaches_the_database_too_late_writes_nothing(
    store: PostgresRunStore,
) -> None:
    job = JOBS[0]
    await store.sync_jobs([job])
    state = (await store.active_jobs())[job.name]
    now = await store.database_now()
    plan = plan_materialization(job, None, now, HORIZON, first_seen=state.created_at)
    assert plan.runs

    stale = await store.materialize_many([(state, plan)], fresh_until=now - timedelta(seconds=1))
    assert stale.runs == 0
    assert await store.pool.fetchval("SELECT count(*) FROM job_runs") == 0
    assert await store.pool.fetchval("SELECT materialized_until FROM jobs") is None

    written = await store.materialize_many([(state, plan)], fresh_until=now + timedelta(seconds=30))
    assert written.runs == len(plan.runs)
    assert (
        await store.pool.fetchval("SELECT materialized_until FROM jobs") == plan.materialized_until
    )

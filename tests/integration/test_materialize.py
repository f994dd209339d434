"""One row per (job, instant), whoever writes it: materializer, manual insert, replay."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from prometheus_client import REGISTRY

from actors.adapters.postgres import PostgresRunStore
from actors.domain import Catchup, IntervalSchedule, Job, PythonSpec, plan_materialization
from actors.scheduling.database_clock import DatabaseClock
from actors.scheduling.materializer import Materializer
from tests.integration.helpers import add_job

pytestmark = pytest.mark.integration

NOW = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)
HORIZON = timedelta(seconds=30)


class FixedClock:
    """The database's clock, faked: it says NOW (the job rows are dated NOW too)."""

    async def read(self) -> datetime:
        return NOW


def _every_second() -> Job:
    return Job(
        name="beat",
        schedule=IntervalSchedule(timedelta(seconds=1)),
        executor=PythonSpec("tests.integration.helpers:record_call"),
    )


def _materializer(store: PostgresRunStore, job: Job) -> Materializer:
    return Materializer(
        store, FixedClock(), HORIZON, timedelta(seconds=1), asyncio.Event(), guard_stale_plans=False
    )


async def _rows_per_instant(store: PostgresRunStore) -> dict[datetime, int]:
    rows = await store.pool.fetch(
        "SELECT scheduled_at, count(*) AS n FROM job_runs GROUP BY scheduled_at"
    )
    return {r["scheduled_at"]: r["n"] for r in rows}


async def test_materializer_manual_insert_and_replay_leave_one_row_per_instant(
    store: PostgresRunStore, schema_url: str
) -> None:
    job = _every_second()
    job_id = await add_job(store, job)
    # The fake clock stands for the database's: the job was first seen at its NOW.
    await store.pool.execute("UPDATE jobs SET created_at = $1", NOW)
    expected = plan_materialization(job, None, NOW, HORIZON)
    instants = [r.scheduled_at for r in expected.runs]
    assert len(instants) == 30

    # Two replicas materialize the same instants at the same time.
    other = await PostgresRunStore.connect(schema_url, max_size=2)
    try:
        inserted = await asyncio.gather(
            _materializer(store, job).tick(), _materializer(other, job).tick()
        )
    finally:
        await other.close()
    assert sum(inserted) == len(instants)
    assert await _rows_per_instant(store) == dict.fromkeys(instants, 1)

    # A manual trigger of an instant the schedule already wrote changes nothing.
    status = await store.pool.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) VALUES ($1, $2, $2, 'manual')"
        " ON CONFLICT (job_id, scheduled_at) DO NOTHING",
        job_id,
        instants[3],
    )
    assert status == "INSERT 0 0"

    # A replayed materialization (the high-water mark lost, the plan written again).
    await store.pool.execute("UPDATE jobs SET materialized_until = NULL")
    assert await _materializer(store, job).tick() == 0
    state = (await store.active_jobs())[job.name]
    assert (await store.materialize_many([(state, expected)])).runs == 0
    assert await _rows_per_instant(store) == dict.fromkeys(instants, 1)
    assert await store.pool.fetchval("SELECT count(*) FROM job_runs") == len(instants)


async def test_duplicate_instant_is_refused_by_the_schema(store: PostgresRunStore) -> None:
    job_id = await add_job(store, _every_second())
    insert = "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) VALUES ($1, $2, $2, $3)"
    await store.pool.execute(insert, job_id, NOW, "schedule")
    with pytest.raises(asyncpg.UniqueViolationError) as refused:
        await store.pool.execute(insert, job_id, NOW, "backfill")
    assert refused.value.constraint_name == "job_runs_one_row_per_instant"
    assert await store.pool.fetchval("SELECT count(*) FROM job_runs") == 1


async def test_a_plan_from_a_superseded_definition_writes_nothing(store: PostgresRunStore) -> None:
    """A replica that planned with the old definition cannot write after a reload changed it."""
    job = _every_second()
    await add_job(store, job)
    stale = (await store.active_jobs())[job.name]
    plan = plan_materialization(job, None, NOW, HORIZON)
    # Another replica reloads: the job now runs every 2 seconds.
    changed = Job(
        name=job.name, schedule=IntervalSchedule(timedelta(seconds=2)), executor=job.executor
    )
    await store.sync_jobs([changed])
    assert (await store.materialize_many([(stale, plan)])).runs == 0
    assert await store.pool.fetchval("SELECT count(*) FROM job_runs") == 0
    # The current definition plans and writes as usual (the sync reset the
    # job's mark to the database's now, so plan on the database's clock here).
    assert (
        await Materializer(
            store, DatabaseClock(store), HORIZON, timedelta(seconds=1), asyncio.Event()
        ).tick()
        > 0
    )
    spacing = await store.pool.fetchval(
        "SELECT min(d) FROM (SELECT scheduled_at - lag(scheduled_at) OVER (ORDER BY scheduled_at)"
        " AS d FROM job_runs) x"
    )
    assert spacing == timedelta(seconds=2)


class MovableClock:
    """The database's clock, faked, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.current = now

    async def read(self) -> datetime:
        return self.current


async def test_a_tick_with_nothing_new_to_plan_leaves_the_job_row_alone(
    store: PostgresRunStore,
) -> None:
    """The mark moves when an instant enters the horizon (or it falls within half a
    horizon of now), not every tick; the rows are every instant all the same."""
    every_10s = Job(
        name="ten",
        schedule=IntervalSchedule(timedelta(seconds=10)),
        executor=PythonSpec("tests.integration.helpers:record_call"),
    )
    daily = Job(
        name="daily",
        schedule=IntervalSchedule(timedelta(days=1)),
        executor=PythonSpec("tests.integration.helpers:record_call"),
    )
    await store.sync_jobs([every_10s, daily])
    await store.pool.execute("UPDATE jobs SET created_at = $1", NOW)
    clock = MovableClock(NOW)
    materializer = Materializer(
        store, clock, HORIZON, timedelta(seconds=1), asyncio.Event(), guard_stale_plans=False
    )
    marks: dict[str, set[datetime]] = {"ten": set(), "daily": set()}
    for second in range(120):
        clock.current = NOW + timedelta(seconds=second)
        await materializer.tick()
        for r in await store.pool.fetch("SELECT name, materialized_until FROM jobs"):
            marks[r["name"]].add(r["materialized_until"])
            # Never behind now: the gauge materialized_behind stays 0.
            assert r["materialized_until"] >= clock.current + HORIZON / 2, r["name"]
    rows = await store.pool.fetch(
        "SELECT j.name, r.scheduled_at FROM job_runs r JOIN jobs j ON j.id = r.job_id"
        " ORDER BY r.scheduled_at"
    )
    end = NOW + timedelta(seconds=119) + HORIZON
    ten = [r["scheduled_at"] for r in rows if r["name"] == "ten"]
    assert ten == list(every_10s.schedule.fire_times(NOW, end))
    assert [r["scheduled_at"] for r in rows if r["name"] == "daily"] == list(
        daily.schedule.fire_times(NOW, end)
    )
    # 120 ticks: the 10-second job's row written once per instant, the daily one's
    # once per half horizon, not 120 times each.
    assert len(marks["ten"]) <= 13
    assert len(marks["daily"]) <= 9


class _BothPlanned:
    """The store, with each write held until both materializers have planned.

    Forces the interleaving of two replicas ticking at once: both read the
    same mark and plan the same dropped instants before either writes.
    """

    def __init__(self, store: PostgresRunStore) -> None:
        self._store = store
        self._arrived = 0
        self._both = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def materialize_many(self, *args: object, **kwargs: object) -> object:
        self._arrived += 1
        if self._arrived == 2:
            self._both.set()
        await asyncio.wait_for(self._both.wait(), 10)
        return await self._store.materialize_many(*args, **kwargs)  # type: ignore[arg-type]


async def test_two_replicas_planning_the_same_dropped_instants_count_them_once(
    store: PostgresRunStore,
) -> None:
    """claimd_runs_missed_total, summed over replicas, is what the gap table holds."""
    job = Job(
        name="beat",
        schedule=IntervalSchedule(timedelta(minutes=1)),
        executor=PythonSpec("tests.integration.helpers:record_call"),
        catchup=Catchup.NONE,
    )
    await store.sync_jobs([job])
    # Planned up to NOW once; the replicas were then down for ten minutes.
    await store.pool.execute("UPDATE jobs SET created_at = $1, materialized_until = $1", NOW)
    clock = MovableClock(NOW + timedelta(minutes=10, seconds=30))
    held = _BothPlanned(store)

    def missed() -> float:
        return REGISTRY.get_sample_value("claimd_runs_missed_total", {"claimd_job": "beat"}) or 0.0

    before = missed()
    replicas = [
        Materializer(
            held,  # type: ignore[arg-type]
            clock,
            HORIZON,
            timedelta(seconds=1),
            asyncio.Event(),
            guard_stale_plans=False,
        )
        for _ in range(2)
    ]
    await asyncio.gather(*(r.tick() for r in replicas))
    recorded = await store.pool.fetchval("SELECT coalesce(sum(count), 0) FROM job_run_gaps")
    assert recorded == 10  # NOW+1m .. NOW+10m, dropped by catchup = none
    assert missed() - before == recorded

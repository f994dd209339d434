"""A plan slower than its on-time tolerance: refused, counted, logged, planned again.

The store's half of the guard (``materialize_many`` refuses a write that
reaches the database after ``fresh_until``) is tested in test_clock.py. These
tests hold the materializer's own write until the database's clock is past its
tolerance and follow what it does with the refusal: nothing is dropped, every
instant of the horizon gets its row on a later tick. And they check the other
half of "planning never holds the event loop": jobs are written in chunks, each
planned from its own read of the database's clock, and a chunk's planning
yields to the other tasks on the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

import actors.scheduling.materializer as materializer_module
from actors.adapters.postgres import PostgresRunStore
from actors.domain import IntervalSchedule, Job, Plan, PythonSpec
from actors.ports import JobState, Materialized
from actors.scheduling.database_clock import DatabaseClock
from actors.scheduling.materializer import Materializer

pytestmark = pytest.mark.integration

HORIZON = timedelta(seconds=30)
STALE_WARNING = "plan reached the database after its on-time tolerance; planning it again"


def _job(name: str, every: timedelta = timedelta(seconds=1)) -> Job:
    return Job(
        name=name,
        schedule=IntervalSchedule(every),
        executor=PythonSpec("tests.integration.helpers:record_call"),
    )


class _CountingClock:
    """The database's clock (a real DatabaseClock), every read kept."""

    def __init__(self, store: PostgresRunStore) -> None:
        self._clock = DatabaseClock(store)
        self.reads: list[datetime] = []

    async def read(self) -> datetime:
        now = await self._clock.read()
        self.reads.append(now)
        return now


class _Recorded:
    """One call of materialize_many: what it was asked to write, and what it answered."""

    def __init__(self, job_ids: list[int], fresh_until: datetime | None) -> None:
        self.job_ids = job_ids
        self.fresh_until = fresh_until
        self.result: Materialized | None = None


class _RecordingStore:
    """The real store; each materialize_many recorded, the first one held if asked.

    ``hold_first``: the first write waits until the database's now() is past
    the tolerance of the clock read it was planned from (a plan that took too
    long). It is measured from the clock read, not from ``fresh_until``, so a
    materializer that stops passing ``fresh_until`` is held all the same.
    """

    def __init__(
        self,
        store: PostgresRunStore,
        clock: _CountingClock,
        *,
        hold_first_for: timedelta | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._hold_for = hold_first_for
        self.calls: list[_Recorded] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        call = _Recorded([state.id for state, _ in plans], fresh_until)
        self.calls.append(call)
        if self._hold_for is not None and len(self.calls) == 1:
            await self._until_database_past(self._clock.reads[-1] + self._hold_for)
        call.result = await self._store.materialize_many(plans, fresh_until)
        return call.result

    async def _until_database_past(self, moment: datetime, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while await self._store.database_now() <= moment:
            if time.monotonic() > deadline:
                raise AssertionError(f"the database's clock did not pass {moment}")
            await asyncio.sleep(0.01)


def _discarded() -> float:
    return REGISTRY.get_sample_value("claimd_plans_discarded_total") or 0.0


async def _instants_by_job(store: PostgresRunStore) -> dict[int, list[datetime]]:
    rows = await store.pool.fetch(
        "SELECT job_id, array_agg(scheduled_at ORDER BY scheduled_at) AS instants"
        " FROM job_runs GROUP BY job_id"
    )
    return {r["job_id"]: list(r["instants"]) for r in rows}


async def _assert_every_instant_written(
    store: PostgresRunStore, jobs: list[Job], planned_at: datetime
) -> None:
    """Each job's rows are its schedule's instants from its creation to its mark,
    and the mark covers the horizon of the last plan; no gap was recorded."""
    states = await store.active_jobs()
    written = await _instants_by_job(store)
    for job in jobs:
        state = states[job.name]
        assert state.materialized_until is not None, job.name
        assert state.created_at is not None, job.name
        assert state.materialized_until >= planned_at + HORIZON, job.name
        expected = list(job.schedule.fire_times(state.created_at, state.materialized_until))
        assert len(expected) >= HORIZON.total_seconds(), job.name
        assert written.get(state.id) == expected, job.name
    assert await store.pool.fetchval("SELECT count(*) FROM job_run_gaps") == 0


async def test_a_plan_slower_than_its_tolerance_is_refused_counted_logged_and_planned_again(
    store: PostgresRunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 (4), issue 17 (5): the materializer's half of the stale-plan guard."""
    monkeypatch.setattr(materializer_module, "MIN_ON_TIME", timedelta(milliseconds=200))
    jobs = [_job(f"beat-{i}") for i in range(5)]
    await store.sync_jobs(jobs)
    clock = _CountingClock(store)
    materializer = Materializer(store, clock, HORIZON, timedelta(milliseconds=50), asyncio.Event())
    assert materializer.on_time == timedelta(milliseconds=200)
    held = _RecordingStore(store, clock, hold_first_for=materializer.on_time)
    materializer.store = held
    discarded_before = _discarded()

    with capture_logs() as logs:
        assert await materializer.tick() == 0
        first = held.calls[0]
        # The plan reached the database after its tolerance: refused, nothing written.
        assert first.fresh_until == clock.reads[0] + materializer.on_time
        assert first.result is not None
        assert first.result.stale
        assert await store.pool.fetchval("SELECT count(*) FROM job_runs") == 0
        assert (
            await store.pool.fetchval(
                "SELECT count(*) FROM jobs WHERE materialized_until IS NOT NULL"
            )
            == 0
        )
        # Planned again on the next tick(s), from a fresh clock. A busy machine may
        # make a retry stale too: each is counted and logged the same way.
        for _ in range(20):
            await materializer.tick()
            last = held.calls[-1].result
            if last is not None and not last.stale:
                break
    last_call = held.calls[-1]
    assert last_call.result is not None
    assert not last_call.result.stale
    assert sorted(last_call.result.written) == sorted(first.job_ids)
    assert last_call.fresh_until is not None

    stale = sum(1 for c in held.calls if c.result is not None and c.result.stale)
    assert stale >= 1
    assert _discarded() - discarded_before == stale
    warnings = [e for e in logs if e["event"] == STALE_WARNING]
    assert len(warnings) == stale
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["jobs"] == len(jobs)
    await _assert_every_instant_written(store, jobs, last_call.fresh_until - materializer.on_time)


async def test_one_tick_writes_every_job_in_chunks_each_planned_from_its_own_clock_read(
    store: PostgresRunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(materializer_module, "CHUNK_JOBS", 3)
    jobs = [_job(f"beat-{i}") for i in range(10)]
    await store.sync_jobs(jobs)
    clock = _CountingClock(store)
    materializer = Materializer(store, clock, HORIZON, timedelta(seconds=1), asyncio.Event())
    recording = _RecordingStore(store, clock)
    materializer.store = recording

    written = await materializer.tick()
    assert written == await store.pool.fetchval("SELECT count(*) FROM job_runs")

    calls = recording.calls
    assert [len(c.job_ids) for c in calls] == [3, 3, 3, 1]
    assert len({i for c in calls for i in c.job_ids}) == 10
    assert all(c.result is not None and not c.result.stale for c in calls)
    # Each chunk's tolerance runs from a clock read of its own: the read before it.
    fresh = [c.fresh_until for c in calls]
    assert fresh == [read + materializer.on_time for read in clock.reads[: len(calls)]]
    assert len(set(clock.reads[: len(calls)])) == len(calls)
    await _assert_every_instant_written(store, jobs, clock.reads[len(calls) - 1])


async def test_planning_a_chunk_yields_to_the_event_loop(
    store: PostgresRunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starts, heartbeats and completions are tasks on the same loop: they run
    while a chunk of many jobs is planned, not only between chunks."""
    # One chunk: no database round trip between the first job planned and the
    # last, so only the planner's own yields can let another task run.
    monkeypatch.setattr(materializer_module, "CHUNK_JOBS", 10_000)
    jobs = [_job(f"minutely-{i:04d}", timedelta(minutes=1)) for i in range(3_000)]
    await store.sync_jobs(jobs)

    ticks = 0
    seen: list[int] = []  # the ticker's count as each job is planned
    real_plan = materializer_module.plan_materialization

    def recording_plan(*args: Any, **kwargs: Any) -> Plan:
        seen.append(ticks)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(materializer_module, "plan_materialization", recording_plan)
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    materializer = Materializer(
        store, DatabaseClock(store), HORIZON, timedelta(seconds=1), asyncio.Event()
    )
    task = asyncio.create_task(ticker())
    try:
        await materializer.tick()
    finally:
        stop.set()
        await task
    assert len(seen) == len(jobs)
    # The ticker ran between the first job planned and the last one.
    assert seen[-1] > seen[0]
    assert (
        await store.pool.fetchval("SELECT count(*) FROM jobs WHERE materialized_until IS NULL") == 0
    )


async def test_a_plan_planned_again_counts_its_herd_once(
    store: PostgresRunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five runs at each instant are no herd of six, however many times a refused
    plan was planned before one was written: ticks do not keep out of them."""
    monkeypatch.setattr(materializer_module, "MIN_ON_TIME", timedelta(milliseconds=200))
    monkeypatch.setattr(materializer_module, "HERD_RUNS", 6)
    waits: list[float] = []

    async def no_wait(stop: asyncio.Event, seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(materializer_module, "wait_for_stop", no_wait)
    jobs = [_job(f"beat-{i}") for i in range(5)]
    await store.sync_jobs(jobs)
    clock = _CountingClock(store)
    materializer = Materializer(store, clock, HORIZON, timedelta(milliseconds=50), asyncio.Event())
    held = _RecordingStore(store, clock, hold_first_for=materializer.on_time)
    materializer.store = held

    def written_plans() -> int:
        return sum(1 for c in held.calls if c.result is not None and c.result.written)

    deadline = time.monotonic() + 20
    # The refused plan, its retry written, then (about a second later, when the
    # next instant enters the horizon) the jobs due again with the instants
    # already planned a second or two ahead.
    while written_plans() < 2:
        assert time.monotonic() < deadline, "the jobs never came due again"
        await materializer.tick()
        await asyncio.sleep(0.02)
    assert held.calls[0].result is not None
    assert held.calls[0].result.stale
    assert waits == []

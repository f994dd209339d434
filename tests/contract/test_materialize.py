"""Writing plans: each instant once, only from the mark it was planned from (a compare and
set), only while fresh, only from the definition it was planned from; gaps recorded once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from actors.domain import Job, Plan, PlannedRun
from actors.domain.history import Gap
from actors.ports import JobState, Materialized, ReplicaStore, StoreUnavailable
from actors.scheduling.materializer import Materializer
from tests.contract.jobs import job
from tests.contract.rows import Rows

MINUTE = timedelta(minutes=1)


def _plan(start: datetime, count: int, *, dropped: tuple[Gap, ...] = ()) -> Plan:
    runs = [PlannedRun(start + i * MINUTE, start + i * MINUTE) for i in range(count)]
    missed = sum(g.count for g in dropped)
    return Plan(runs, start + count * MINUTE, missed, dropped)


async def _state(store: ReplicaStore, name: str = "job") -> JobState:
    return (await store.active_jobs())[name]


async def test_the_same_plan_twice_writes_each_instant_once(store: ReplicaStore) -> None:
    await store.sync_jobs([job()])
    state = await _state(store)
    start = (await store.database_now()).replace(microsecond=0) + MINUTE
    plan = _plan(start, 5)
    done = await store.materialize_many([(state, plan)])
    assert (done.runs, done.written, dict(done.moved), done.stale) == (
        5,
        frozenset({state.id}),
        {},
        False,
    )
    assert (await _state(store)).materialized_until == plan.materialized_until
    # Another replica planned the same instants from the mark it had read: refused whole.
    again = await store.materialize_many([(state, plan)])
    assert (again.runs, again.written) == (0, frozenset())
    assert dict(again.moved) == {state.id: plan.materialized_until}
    # From the mark now, the overlapping instants are not written again.
    moved = await _state(store)
    overlap = await store.materialize_many([(moved, _plan(start + 3 * MINUTE, 4))])
    assert overlap.runs == 2
    assert (await _state(store)).materialized_until == start + 7 * MINUTE


async def test_two_replicas_planning_from_one_mark_write_once(store: ReplicaStore) -> None:
    """The compare-and-set on the mark, in the racing order: both read, both write."""
    await store.sync_jobs([job("a"), job("b")])
    a, b = await _state(store, "a"), await _state(store, "b")
    start = (await store.database_now()).replace(microsecond=0) + MINUTE
    first = await store.materialize_many([(a, _plan(start, 3)), (b, _plan(start, 3))])
    assert (first.runs, first.written) == (6, frozenset({a.id, b.id}))
    # The second replica read "a" before the first wrote; "b" it read afterwards.
    fresh_b = await _state(store, "b")
    second = await store.materialize_many(
        [(a, _plan(start, 4)), (fresh_b, _plan(start + 3 * MINUTE, 2))]
    )
    assert (second.runs, second.written) == (2, frozenset({b.id}))
    assert dict(second.moved) == {a.id: start + 3 * MINUTE}
    assert (await _state(store, "a")).materialized_until == start + 3 * MINUTE


async def test_a_stale_plan_or_one_from_a_superseded_definition_writes_nothing(
    store: ReplicaStore,
) -> None:
    await store.sync_jobs([job()])
    state = await _state(store)
    now = await store.database_now()
    start = now.replace(microsecond=0) + MINUTE
    stale = await store.materialize_many([(state, _plan(start, 3))], fresh_until=now - MINUTE)
    assert (stale.stale, stale.runs, stale.written) == (True, 0, frozenset())
    assert (await _state(store)).materialized_until is None
    fresh = now + timedelta(hours=1)
    await store.sync_jobs([job(max_attempts=7)])  # a new definition, same schedule
    superseded = await store.materialize_many([(state, _plan(start, 3))], fresh_until=fresh)
    assert (superseded.runs, superseded.written, superseded.stale) == (0, frozenset(), False)
    # Not a moved mark (planning again from it is refused again): the catalog must be read.
    assert (dict(superseded.moved), superseded.superseded) == ({}, frozenset({state.id}))
    current = await _state(store)
    assert (await store.materialize_many([(current, _plan(start, 3))], fresh_until=fresh)).runs == 3
    version = await store.catalog_version()
    assert (await _state(store)).materialized_until == start + 3 * MINUTE
    assert await store.catalog_version() == version  # the mark is not the catalog's
    claimable = await store.next_due_in(timedelta(0))
    assert claimable is not None


async def test_dropped_instants_are_recorded_as_gaps_once(store: ReplicaStore, rows: Rows) -> None:
    await store.sync_jobs([job()])
    state = await _state(store)
    start = (await store.database_now()).replace(microsecond=0) - 10 * MINUTE
    gap = Gap(start, start + 4 * MINUTE, 5, "missed while no scheduler ran (catchup = none)")
    done = await store.materialize_many([(state, _plan(start + 5 * MINUTE, 2, dropped=(gap,)))])
    assert (done.runs, dict(done.missed)) == (2, {state.id: 5})
    assert await rows.gaps("job") == [(gap.first, gap.last, 5, gap.reason)]
    # Another replica's plan of the same downtime, from the mark now: its gap overlaps.
    wider = Gap(start - MINUTE, start + 6 * MINUTE, 8, gap.reason)
    again = await store.materialize_many(
        [(await _state(store), _plan(start + 7 * MINUTE, 1, dropped=(wider,)))]
    )
    assert (again.runs, dict(again.missed)) == (1, {})
    assert await rows.gaps("job") == [(gap.first, gap.last, 5, gap.reason)]


class _SyncBetweenReadAndWrite:
    """The store, with a reload's sync landing after the materializer's catalog read.

    The tick then holds jobs the sync removed or changed, and its plans of
    them are refused. It counts the writes: a tick that plans a refused job
    again and again never ends, and never reads the catalog as it is now.
    """

    MAX_WRITES = 20

    def __init__(self, store: ReplicaStore, jobs: list[Job]) -> None:
        self._store = store
        self._sync: list[Job] | None = jobs
        self.writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def active_jobs(self) -> dict[str, JobState]:
        read = await self._store.active_jobs()
        if self._sync is not None:
            jobs, self._sync = self._sync, None
            await self._store.sync_jobs(jobs)
        return read

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        self.writes += 1
        assert self.writes <= self.MAX_WRITES, "the tick never ends: refused plans planned again"
        return await self._store.materialize_many(plans, fresh_until)


class _StoreClock:
    def __init__(self, store: ReplicaStore) -> None:
        self._store = store

    async def read(self) -> datetime:
        return await self._store.database_now()


async def test_a_tick_that_meets_a_reload_ends_and_plans_the_jobs_as_reloaded(
    store: ReplicaStore,
) -> None:
    """Issue 17: a job removed or changed by a sync after the tick read the catalog.

    Its plan is refused (the job is disabled, or its definition is not the one
    planned from). That is not another replica's moved mark: planning it again
    from the mark now is refused again, and a tick that did so never ended, so
    it never read the catalog again and the reload's added and changed jobs
    were never planned (an added job never ran).
    """
    every_minute = "* * * * *"
    await store.sync_jobs([job(name, cron=every_minute) for name in "abc"])
    # a unchanged, b every two minutes, c removed, d added.
    reload = [job("a", cron=every_minute), job("b", cron="*/2 * * * *")]
    reload.append(job("d", cron=every_minute))
    racing = _SyncBetweenReadAndWrite(store, reload)
    horizon = timedelta(minutes=5)
    materializer = Materializer(
        racing,  # type: ignore[arg-type]
        _StoreClock(store),
        horizon,
        timedelta(seconds=1),
        asyncio.Event(),
    )
    before = await store.database_now()
    await materializer.tick()
    await materializer.tick()
    marks = {name: state.materialized_until for name, state in (await store.active_jobs()).items()}
    assert sorted(marks) == ["a", "b", "d"]
    for name, mark in marks.items():
        assert mark is not None, name
        assert mark >= before + horizon, (name, mark)


class _WriteFailsOnce:
    """The store, whose first write of plans fails as in an outage (the connection lost)."""

    def __init__(self, store: ReplicaStore) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("connection lost during the write")
        return await self._store.materialize_many(plans, fresh_until)


async def test_a_tick_whose_write_fails_plans_those_jobs_when_restarted(
    store: ReplicaStore,
) -> None:
    """The supervisor restarts the same materializer after an outage: the jobs of the
    chunk whose write failed must be planned again, not stay out of its heap."""
    await store.sync_jobs([job("a", cron="* * * * *")])
    failing = _WriteFailsOnce(store)
    horizon = timedelta(minutes=5)
    materializer = Materializer(
        failing,  # type: ignore[arg-type]
        _StoreClock(store),
        horizon,
        timedelta(seconds=1),
        asyncio.Event(),
    )
    with pytest.raises(StoreUnavailable):
        await materializer.tick()
    before = await store.database_now()
    await materializer.tick()
    mark = (await _state(store, "a")).materialized_until
    assert mark is not None
    assert mark >= before + horizon


class _EditedAndRevertedAroundTheWrite(_SyncBetweenReadAndWrite):
    """A reload edits the job after the catalog read; another reverts it after the refused write."""

    def __init__(self, store: ReplicaStore, edited: list[Job], reverted: list[Job]) -> None:
        super().__init__(store, edited)
        self._revert: list[Job] | None = reverted

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        done = await super().materialize_many(plans, fresh_until)
        if self._revert is not None:
            jobs, self._revert = self._revert, None
            await self._store.sync_jobs(jobs)
        return done


async def test_a_job_edited_and_reverted_around_a_refused_write_is_planned(
    store: ReplicaStore,
) -> None:
    """The catalog read after the refusal finds the job as the tick's copy had it (same
    definition, same mark): that copy, left out of the heap by the refusal, must not be
    kept as it is, or the job is never planned again."""
    every_minute = "* * * * *"
    await store.sync_jobs([job("a", cron=every_minute)])
    racing = _EditedAndRevertedAroundTheWrite(
        store, [job("a", cron=every_minute, max_attempts=4)], [job("a", cron=every_minute)]
    )
    horizon = timedelta(minutes=5)
    materializer = Materializer(
        racing,  # type: ignore[arg-type]
        _StoreClock(store),
        horizon,
        timedelta(seconds=1),
        asyncio.Event(),
    )
    before = await store.database_now()
    await materializer.tick()
    await materializer.tick()
    mark = (await _state(store, "a")).materialized_until
    assert mark is not None
    assert mark >= before + horizon

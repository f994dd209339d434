"""The reaper and the materializer on in-memory ports, on a clock the test moves."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest

from actors.domain import Catchup, RunState
from actors.ports import DispatchMessage
from actors.scheduling.materializer import Materializer
from actors.scheduling.reaper import Reaper
from actors.testing.memory import InMemoryRunStore
from tests.unit.memory_world import LEASE, job, world

pytestmark = pytest.mark.timeout(30)


def reaper(store: InMemoryRunStore, retention: timedelta | None = None) -> Reaper:
    return Reaper(store, timedelta(hours=1), asyncio.Event(), retention=retention)


async def start(store: InMemoryRunStore, worker: str) -> str:
    (c,) = await store.claim_due_runs("replica-a", 1, LEASE, 100)
    message = DispatchMessage(c.run_id, c.epoch, c.job, c.scheduled_at, c.attempt, "prod")
    (s,), _ = await store.start_runs(worker, [message], LEASE)
    return s.run_id


async def test_an_expired_lease_is_recovered_and_claimed_under_a_new_epoch() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    run_id = await start(store, "lost-worker")
    actor = reaper(store)
    clock.advance(LEASE / 2)
    assert await actor.reap_once() == 0  # a live lease is left alone
    clock.advance(LEASE)
    assert await actor.reap_once() == 1
    run = store.runs[run_id]
    assert (run.state, run.attempt, run.epoch) == (RunState.PENDING, 2, 1)
    (again,) = await store.claim_due_runs("replica-b", 1, LEASE, 100)
    assert (again.run_id, again.epoch, again.attempt) == (run_id, 2, 2)
    assert [(a.worker, a.attempt) for a in store.attempts] == [("lost-worker", 1)]


async def test_the_last_attempts_lost_lease_fails_the_run() -> None:
    clock, store, _ = await world(job(max_attempts=1))
    store.add_run("beat", clock.now())
    run_id = await start(store, "lost-worker")
    clock.advance(LEASE * 2)
    assert await reaper(store).reap_once() == 1
    assert store.runs[run_id].state is RunState.FAILED
    assert store.in_state(RunState.PENDING) == []


async def test_pending_runs_of_a_removed_job_are_cancelled() -> None:
    clock, store, _ = await world(job("gone"), job("kept"))
    store.add_run("gone", clock.now())
    await store.sync_jobs([job("kept")])  # cancels what is pending now
    late = store.add_run("gone", clock.now() + timedelta(seconds=1))  # a retry came back
    await reaper(store).reap_once()
    assert late.state is RunState.CANCELLED


async def test_history_past_its_retention_is_pruned() -> None:
    clock, store, _ = await world(job(max_attempts=1))
    store.add_run("beat", clock.now())
    await start(store, "w")
    clock.advance(LEASE * 2)
    await reaper(store).reap_once()  # failed: terminal, finished now
    actor = reaper(store, retention=timedelta(days=1))
    assert await actor.prune_once() == 0
    clock.advance(timedelta(days=2))
    assert await actor.prune_once() == 1
    assert store.runs == {}


async def test_the_materializer_plans_each_instant_once_on_the_database_clock() -> None:
    clock, store, _ = await world(job(every=timedelta(minutes=1)))
    actor = Materializer(store, clock, timedelta(minutes=5), timedelta(seconds=1), asyncio.Event())
    assert await actor.tick() == 5
    assert await actor.tick() == 0  # idempotent: same instants, nothing new
    clock.advance(timedelta(minutes=2))
    assert await actor.tick() == 2
    instants = sorted(r.scheduled_at for r in store.runs.values())
    assert len(set(instants)) == len(instants) == 7
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(instants))


async def test_a_paused_job_is_not_planned() -> None:
    clock, store, _ = await world(job("a"), job("b"))
    await store.set_paused("b", True)
    actor = Materializer(store, clock, timedelta(minutes=3), timedelta(seconds=1), asyncio.Event())
    await actor.tick()
    assert {r.job for r in store.runs.values()} == {"a"}


async def test_instants_a_catch_up_policy_drops_are_recorded_as_gaps() -> None:
    clock, store, _ = await world(job(every=timedelta(minutes=1), catchup=Catchup.NONE))
    actor = Materializer(store, clock, timedelta(minutes=2), timedelta(seconds=1), asyncio.Event())
    await actor.tick()
    clock.advance(timedelta(minutes=10))  # down for ten minutes
    await actor.tick()
    dropped = sum(gap.count for _, gap in store.gaps)
    assert dropped > 0
    planned = {r.scheduled_at for r in store.runs.values()}
    assert not any(gap.first <= t <= gap.last for _, gap in store.gaps for t in planned)

"""The in-memory RunStore keeps the SQL's guards: the actors' unit tests lean on them.

The same rules are proved on PostgreSQL by tests/integration (test_claim*,
test_semantics, test_heartbeat); these keep the fake honest, so that a unit
test passing on it says something.
"""

from __future__ import annotations

from datetime import timedelta

from actors.domain import Catchup, ExecutionResult, Outcome, RunState, decide_attempt
from actors.ports import Completion, DispatchMessage
from actors.testing.memory import InMemoryRunStore
from actors.testing.memory_rows import DEADLINE_MISSED, SUPERSEDED, RunRow
from tests.unit.memory_world import LEASE, job, world


def message(run: RunRow) -> DispatchMessage:
    return DispatchMessage(run.id, run.epoch, run.job, run.scheduled_at, run.attempt, "d")


async def _claim_all(store: InMemoryRunStore, owner: str, limit: int = 10) -> list[RunRow]:
    return [store.runs[c.run_id] for c in await store.claim_due_runs(owner, limit, LEASE, 100)]


async def test_claims_are_disjoint_bounded_and_oldest_due_first() -> None:
    clock, store, _ = await world()
    for minutes in (3, 1, 2, 4):
        store.add_run("beat", clock.now() - timedelta(minutes=minutes))
    store.add_run("beat", clock.now() + timedelta(minutes=1))  # not due
    first = await store.claim_due_runs("a", 2, LEASE, max_claimed=3)
    second = await store.claim_due_runs("b", 5, LEASE, max_claimed=3)
    assert [c.scheduled_at for c in first] == [
        clock.now() - timedelta(minutes=4),
        clock.now() - timedelta(minutes=3),
    ]
    assert len(second) == 1  # max_claimed: 3 claimed in all
    assert not {c.run_id for c in first} & {c.run_id for c in second}
    assert all(c.epoch == 1 for c in first + second)
    assert await store.claim_due_runs("c", 5, LEASE, max_claimed=3) == []


async def test_a_zombies_completion_is_fenced_by_the_epoch() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    (run,) = await _claim_all(store, "a")
    started, _ = await store.start_runs("w1", [message(run)], LEASE)
    assert [s.run_id for s in started] == [run.id]
    old_epoch = run.epoch
    clock.advance(LEASE + timedelta(seconds=1))
    assert [t for _, _, t in await store.reap_expired_leases(10)] == ["running->pending"]
    (again,) = await _claim_all(store, "b")
    assert (again.epoch, again.attempt) == (old_epoch + 1, 2)
    await store.start_runs("w2", [message(again)], LEASE)  # the new attempt runs
    late = Completion(run.id, old_epoch, ExecutionResult(Outcome.SUCCEEDED), None, "w1")
    assert await store.complete_runs([late]) == set()
    assert (run.state, run.lease_owner) == (RunState.RUNNING, "w2")
    assert await store.extend_leases("w1", [(run.id, old_epoch)], LEASE) == set()


async def test_the_reaper_counts_attempts_and_fails_at_the_limit() -> None:
    clock, store, _ = await world(job(max_attempts=2))
    store.add_run("beat", clock.now())
    transitions = []
    for worker in ("w1", "w2"):
        (run,) = await _claim_all(store, "a")
        await store.start_runs(worker, [message(run)], LEASE)
        clock.advance(LEASE + timedelta(seconds=1))
        transitions += [t for _, _, t in await store.reap_expired_leases(10)]
    assert transitions == ["running->pending", "running->failed"]
    assert (run.state, run.outcome) == (RunState.FAILED, "lease_expired")
    assert [(a.attempt, a.worker, a.outcome) for a in store.attempts] == [
        (1, "w1", Outcome.LEASE_EXPIRED),
        (2, "w2", Outcome.LEASE_EXPIRED),
    ]


async def test_a_claim_that_expires_unstarted_keeps_its_attempt() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    (run,) = await _claim_all(store, "a")
    clock.advance(LEASE + timedelta(seconds=1))
    assert [t for _, _, t in await store.reap_expired_leases(10)] == ["claimed->pending"]
    assert (run.state, run.attempt, store.attempts) == (RunState.PENDING, 1, [])


async def test_a_completion_applies_the_domains_verdict() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    (run,) = await _claim_all(store, "a")
    (started,), _ = await store.start_runs("w", [message(run)], LEASE)
    verdict = decide_attempt(
        Outcome.FAILED,
        state=RunState.RUNNING,
        attempt=1,
        max_attempts=3,
        policy=started.retry,
        run_id=run.id,
    )
    failed = ExecutionResult(Outcome.FAILED, exit_code=2, error="boom")
    assert await store.complete_runs([Completion(run.id, run.epoch, failed, verdict, "w")]) == {
        (run.id, run.epoch)
    }
    assert verdict.due_in is not None
    assert (run.state, run.attempt, run.due_at) == (
        RunState.PENDING,
        2,
        clock.now() + verdict.due_in,
    )
    assert (run.started_at, run.lease_owner) == (None, None)


async def test_release_only_touches_this_owners_claim_under_its_epoch() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    claimed = await store.claim_due_runs("a", 10, LEASE, 100)
    assert await store.release_unpublished("b", claimed) == 0
    assert await store.release_unpublished("a", claimed) == 1
    assert await store.release_unpublished("a", claimed) == 0  # pending now
    assert store.runs[claimed[0].run_id].state is RunState.PENDING


async def test_a_start_is_taken_up_again_only_when_the_worker_says_so() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    (run,) = await _claim_all(store, "a")
    await store.start_runs("w", [message(run)], LEASE)
    _, (owned,) = await store.start_runs("w", [message(run)], LEASE)
    assert owned.reason == "owned"
    again, _ = await store.start_runs("w", [message(run)], LEASE, retake={(run.id, run.epoch)})
    assert [s.run_id for s in again] == [run.id]
    _, (other,) = await store.start_runs("x", [message(run)], LEASE, retake={(run.id, run.epoch)})
    assert other.reason == "owned"


async def test_policies_hold_at_the_claim_deadline_and_latest() -> None:
    clock, store, _ = await world(
        job("late", starting_deadline=timedelta(seconds=30)),
        job("newest", catchup=Catchup.LATEST),
    )
    late = store.add_run("late", clock.now() - timedelta(minutes=1))
    older = store.add_run("newest", clock.now() - timedelta(minutes=2))
    newer = store.add_run("newest", clock.now() - timedelta(minutes=1))
    claimed = await store.claim_due_runs("a", 10, LEASE, 100)
    assert [c.run_id for c in claimed] == [newer.id]
    assert (late.state, late.error, late.epoch) == (RunState.SKIPPED, DEADLINE_MISSED, 0)
    assert (older.state, older.error) == (RunState.SKIPPED, SUPERSEDED)


async def test_materializing_the_same_plan_twice_writes_each_instant_once() -> None:
    from actors.domain import decode_job, plan_materialization

    clock, store, _ = await world()
    (state,) = (await store.active_jobs()).values()
    plan = plan_materialization(
        decode_job(state.name, state.definition), None, clock.now(), timedelta(minutes=5)
    )
    assert (await store.materialize_many([(state, plan)])).runs == 5
    assert (await store.materialize_many([(state, plan)])).runs == 0
    assert len(store.runs) == 5
    stale = await store.materialize_many([(state, plan)], fresh_until=clock.now() - LEASE)
    assert stale.runs == 0


async def test_an_interrupted_run_goes_back_at_once_with_its_attempt() -> None:
    clock, store, _ = await world(job(max_attempts=1))
    store.add_run("beat", clock.now() - timedelta(minutes=1))
    (run,) = await _claim_all(store, "a")
    await store.start_runs("w", [message(run)], LEASE)
    assert await store.interrupt_runs("someone-else", [(run.id, run.epoch)]) == 0
    assert await store.interrupt_runs("w", [(run.id, run.epoch)]) == 1
    assert (run.state, run.attempt, run.due_at) == (RunState.PENDING, 1, clock.now())
    assert [a.outcome for a in store.attempts] == [Outcome.INTERRUPTED]


async def test_a_run_claimed_ahead_stays_within_reach_of_pause_reload_and_removal() -> None:
    """SET_PAUSED, WITHDRAW_FUTURE_RUNS, DISABLE_REMOVED_JOBS on a claimed, unstarted run."""
    clock, store, _ = await world()
    ahead = timedelta(seconds=1)

    async def claimed_ahead() -> RunRow:
        run = store.add_run("beat", clock.now() + timedelta(milliseconds=500))
        [claim] = await store.claim_due_runs("a", 10, LEASE, 100, ahead=ahead)
        assert claim.run_id == run.id
        return run

    paused = await claimed_ahead()
    await store.set_paused("beat", True)
    assert (paused.state, paused.lease_owner, paused.epoch) == (RunState.PENDING, None, 1)
    clock.advance(ahead)
    _, [stale] = await store.start_runs("w", [message(paused)], LEASE)
    assert stale.reason == "stale"
    await store.set_paused("beat", False)
    del store.runs[paused.id]

    withdrawn = await claimed_ahead()
    await store.sync_jobs([job(every=timedelta(minutes=7))])
    assert withdrawn.id not in store.runs

    # A claim the pause did not see (it committed after the pause read): the start hands it back.
    unseen = await claimed_ahead()
    store.jobs["beat"].paused = True
    clock.advance(ahead)
    _, [refused] = await store.start_runs("w", [message(unseen)], LEASE)
    assert (refused.reason, unseen.state, unseen.lease_owner) == ("stale", RunState.PENDING, None)
    store.jobs["beat"].paused = False
    del store.runs[unseen.id]

    removed = await claimed_ahead()
    await store.sync_jobs([])
    assert (removed.state, removed.error) == (RunState.CANCELLED, "job removed from config")


async def test_a_job_added_back_after_a_removal_has_its_instants_ahead_planned_again() -> None:
    """RESTORE_READDED_JOB's rule, as tests/integration/test_operations.py proves it on SQL."""
    from actors.domain import decode_job, plan_materialization

    clock, store, _ = await world()

    async def materialize() -> None:
        (state,) = (await store.active_jobs()).values()
        plan = plan_materialization(
            decode_job(state.name, state.definition),
            state.materialized_until,
            clock.now(),
            timedelta(minutes=5),
        )
        await store.materialize_many([(state, plan)])

    await materialize()
    ahead = {r.scheduled_at for r in store.runs.values()}
    assert len(ahead) == 5
    await store.sync_jobs([])
    assert {r.state for r in store.runs.values()} == {RunState.CANCELLED}
    operator_cancelled = min(store.runs.values(), key=lambda r: r.scheduled_at)
    operator_cancelled.error = "cancelled by alice"  # not the removal's: stays cancelled
    await store.sync_jobs([job()])
    await materialize()
    by_instant = {r.scheduled_at: r for r in store.runs.values()}
    assert set(by_instant) == ahead
    assert by_instant[operator_cancelled.scheduled_at].state is RunState.CANCELLED
    assert [
        r.state for t, r in sorted(by_instant.items()) if t != operator_cancelled.scheduled_at
    ] == [RunState.PENDING] * 4


async def test_a_removal_before_any_tick_gives_the_instants_due_meanwhile_their_rows() -> None:
    """REMOVED_JOBS_TO_PLAN's rule, as tests/integration/test_reload_race.py proves it on SQL."""
    clock, store, _ = await world()  # beat: every minute, never planned yet
    added = clock.now()
    clock.advance(timedelta(minutes=2, seconds=30))
    await store.sync_jobs([])
    rows = sorted(store.runs.values(), key=lambda r: r.scheduled_at)
    assert len(rows) == 2  # the instants of the two and a half minutes it was in the config
    assert all(added < r.scheduled_at <= clock.now() for r in rows)
    assert {(r.state, r.error) for r in rows} == {(RunState.CANCELLED, "job removed from config")}
    # Back, and removed again a moment later: nothing for the time it was out of the config.
    clock.advance(timedelta(minutes=3))
    back = clock.now()
    await store.sync_jobs([job()])
    clock.advance(timedelta(seconds=70))
    await store.sync_jobs([])
    later = [r for r in store.runs.values() if r.scheduled_at > rows[-1].scheduled_at]
    assert [r.state for r in later] == [RunState.CANCELLED]
    assert back < later[0].scheduled_at <= clock.now()

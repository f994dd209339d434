"""The claimer on in-memory ports: it claims only while the gate is open, under its bound."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.domain import RunState
from actors.pacing import Backoff, BrokerGate, ClaimedBatch
from actors.scheduling.claimer import Claimer
from actors.testing.memory import InMemoryRunStore
from tests.unit.memory_world import LEASE, job, until, world

pytestmark = pytest.mark.timeout(30)


def claimer(
    store: InMemoryRunStore,
    gate: BrokerGate,
    *,
    batch: int = 4,
    max_claimed: int = 100,
    interval: timedelta = timedelta(hours=1),
) -> tuple[Claimer, asyncio.Queue[ClaimedBatch | None], asyncio.Event]:
    outbox: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue(maxsize=4)
    stop = asyncio.Event()
    return (
        Claimer(
            store,
            "replica-a",
            outbox,
            gate,
            batch=batch,
            lease=LEASE,
            max_claimed=max_claimed,
            interval=interval,
            stop=stop,
        ),
        outbox,
        stop,
    )


def closed_gate() -> BrokerGate:
    """A gate that a failed publish closed, and that only a success reopens here."""
    gate = BrokerGate(backoff=Backoff(initial=3600, maximum=3600))
    gate.failed()
    return gate


async def test_claims_stop_at_the_in_flight_bound_until_runs_start() -> None:
    clock, store, _ = await world()
    for minutes in range(10):
        store.add_run("beat", clock.now() - timedelta(minutes=minutes))
    actor, outbox, _ = claimer(store, BrokerGate(), batch=4, max_claimed=6)
    assert [await actor.claim_once() for _ in range(3)] == [4, 2, 0]
    batches = [outbox.get_nowait(), outbox.get_nowait()]
    assert [len(b.runs) for b in batches if b is not None] == [4, 2]
    assert outbox.empty()
    # Claimed runs that leave `claimed` (started) make room again.
    for run in store.in_state(RunState.CLAIMED)[:3]:
        run.state = RunState.RUNNING
    assert await actor.claim_once() == 3
    assert len(store.in_state(RunState.PENDING)) == 1


async def test_a_closed_gate_claims_nothing_and_an_opened_one_claims() -> None:
    clock, store, _ = await world()
    store.add_run("beat", clock.now())
    gate = closed_gate()
    actor, outbox, stop = claimer(store, gate)
    task = asyncio.create_task(actor.run())
    await until(lambda: gate._reopen is not None, "the gate waits to reopen")
    for _ in range(20):
        await asyncio.sleep(0)  # let the loop run: a claimer ignoring the gate would claim now
    assert store.in_state(RunState.CLAIMED) == []
    assert outbox.empty()
    gate.succeeded()
    batch = await asyncio.wait_for(outbox.get(), 5)
    assert batch is not None
    assert [r.job for r in batch.runs] == ["beat"]
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_a_stop_ends_the_claimers_rest_at_once() -> None:
    _, store, _ = await world()
    actor, outbox, stop = claimer(store, BrokerGate(), interval=timedelta(hours=1))
    task = asyncio.create_task(actor.run())
    for _ in range(5):
        await asyncio.sleep(0)  # the claimer claims (nothing due) and rests
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 5)  # not an hour
    assert outbox.empty()  # nothing due, nothing sent; the end of stream is the wiring's


async def test_a_stop_while_the_gate_is_closed_ends_the_claimer_too() -> None:
    _, store, _ = await world()
    actor, _, stop = claimer(store, closed_gate())
    task = asyncio.create_task(actor.run())
    await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_due_runs_that_must_not_run_are_skipped_before_the_claim() -> None:
    clock, store, _ = await world(job(starting_deadline=timedelta(seconds=30)))
    late = store.add_run("beat", clock.now() - timedelta(minutes=5))
    fresh = store.add_run("beat", clock.now())
    actor, outbox, _ = claimer(store, BrokerGate())
    assert await actor.claim_once() == 1
    assert late.state is RunState.SKIPPED
    batch = outbox.get_nowait()
    assert batch is not None
    assert [r.run_id for r in batch.runs] == [fresh.id]

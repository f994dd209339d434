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


async def _sizes(outbox: asyncio.Queue[ClaimedBatch | None], runs: int) -> list[int]:
    """The sizes of the batches sent until ``runs`` runs have come."""
    sizes: list[int] = []
    while sum(sizes) < runs:
        batch = await asyncio.wait_for(outbox.get(), 5)
        assert batch is not None
        sizes.append(len(batch.runs))
    return sizes


async def test_a_herd_is_claimed_in_growing_passes_and_the_next_pass_after_it_is_a_batch() -> None:
    """Full passes double the next one's limit (up to HERD_GROWTH batches); a short one resets it.

    Each pass costs its round trips whatever it claims: a herd of 20,000 in
    passes of 500 was not all claimed within claim_ahead.
    """
    clock, store, _ = await world()
    for seconds in range(40):
        store.add_run("beat", clock.now() - timedelta(seconds=seconds))
    actor, outbox, stop = claimer(store, BrokerGate(), batch=4, max_claimed=100)
    task = asyncio.create_task(actor.run())
    assert await _sizes(outbox, 40) == [4, 8, 16, 12]  # 4 batches at most: 16
    await until(lambda: actor._rest_until is not None, "the claimer rests")
    for seconds in range(10):
        store.add_run("beat", clock.now() - timedelta(minutes=1, seconds=seconds))
    actor.run_pending(clock.now())
    assert await _sizes(outbox, 10) == [4, 6]  # after the short pass: a batch again
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_a_claim_pass_grows_to_a_quarter_of_max_claimed_at_most() -> None:
    _, store, _ = await world()
    actor, _, _ = claimer(store, BrokerGate(), batch=4, max_claimed=20)
    assert [actor._grown(n) for n in (4, 5)] == [5, 5]  # a quarter of 20
    small, _, _ = claimer(store, BrokerGate(), batch=4, max_claimed=8)
    assert small._grown(4) == 4  # never below the batch

"""Dispatcher and compensator on in-memory ports: every claimed run is published or released."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from actors.domain import ClaimedRun, RunState
from actors.pacing import Backoff, BrokerGate, ClaimedBatch
from actors.ports import DispatchMessage, StoreUnavailable
from actors.scheduling.compensator import Compensator
from actors.scheduling.dispatcher import Dispatcher
from actors.testing.memory import InMemoryBroker, InMemoryRunStore
from tests.unit.memory_world import LEASE, world

pytestmark = pytest.mark.timeout(30)
Releases = asyncio.Queue[tuple[ClaimedRun, ...] | None]


class Inbox:
    """A sink that keeps what the broker hands it (a worker's inbox, minus the worker)."""

    def __init__(self) -> None:
        self.messages: list[DispatchMessage] = []

    def put(self, message: DispatchMessage) -> None:
        self.messages.append(message)


async def claimed(store: InMemoryRunStore, n: int) -> ClaimedBatch:
    for minutes in range(n):
        store.add_run("beat", store.clock.now() - timedelta(minutes=minutes))
    return ClaimedBatch(tuple(await store.claim_due_runs("replica-a", n, LEASE, 100)))


def dispatcher(broker: InMemoryBroker, gate: BrokerGate) -> tuple[Dispatcher, Releases]:
    releases: Releases = asyncio.Queue()
    return Dispatcher(broker, "prod", asyncio.Queue(), releases, gate), releases


async def test_failed_publishes_go_to_the_compensator_and_back_to_pending() -> None:
    _, store, broker = await world()
    inbox = broker.subscribe(Inbox())
    broker.fail_every(2)
    gate = BrokerGate(backoff=Backoff(initial=3600, maximum=3600))
    actor, releases = dispatcher(broker, gate)
    batch = await claimed(store, 4)
    failed = await actor.dispatch(batch)
    assert len(failed) == 2
    assert isinstance(inbox, Inbox)
    published = {m.run_id for m in inbox.messages}
    assert published == {r.run_id for r in batch.runs} - {r.run_id for r in failed}
    assert all(m.deployment == "prod" for m in inbox.messages)
    assert not gate.is_open  # this replica claims nothing more until the broker answers
    assert releases.get_nowait() == tuple(failed)
    compensator = Compensator(store, "replica-a", releases)
    assert await compensator.release(tuple(failed)) == 2
    assert {r.id for r in store.in_state(RunState.PENDING)} == {r.run_id for r in failed}
    assert len(store.in_state(RunState.CLAIMED)) == 2  # the published ones wait for a worker


async def test_a_batch_reaching_a_closed_gate_is_released_unpublished() -> None:
    _, store, broker = await world()
    gate = BrokerGate(backoff=Backoff(initial=3600, maximum=3600))
    gate.failed()
    actor, releases = dispatcher(broker, gate)
    batch = await claimed(store, 3)
    assert await actor.dispatch(batch) == list(batch.runs)
    assert broker.attempts == 0  # not a publish timeout per run
    assert releases.get_nowait() == batch.runs


async def test_a_successful_publish_opens_the_gate_again() -> None:
    _, store, broker = await world()
    gate = BrokerGate(backoff=Backoff(initial=3600, maximum=3600))
    actor, _ = dispatcher(broker, gate)
    broker.down = ConnectionError("down")
    await actor.dispatch(await claimed(store, 1))
    assert not gate.is_open
    broker.down = None
    gate._open.set()  # the probe answered
    await actor.dispatch(await claimed(store, 1))
    assert gate.is_open
    assert gate.backoff.failures == 0  # only a publish resets the backoff


async def test_a_broker_raising_for_the_whole_batch_fails_every_run() -> None:
    class Broken(InMemoryBroker):
        async def publish_many(
            self, messages: Sequence[DispatchMessage]
        ) -> list[BaseException | None]:
            raise RuntimeError("client bug")

    _, store, _ = await world()
    actor, releases = dispatcher(Broken(), BrokerGate(backoff=Backoff(3600, 3600)))
    batch = await claimed(store, 2)
    assert await actor.dispatch(batch) == list(batch.runs)
    assert releases.get_nowait() == batch.runs


async def test_the_compensator_waits_out_a_database_outage() -> None:
    _, store, _ = await world()
    batch = await claimed(store, 2)
    calls = 0

    class Flaky(InMemoryRunStore):
        async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise StoreUnavailable("restarting")
            return await super().release_unpublished(owner, runs)

    flaky = Flaky(store.clock, jobs=store.jobs, runs=store.runs)
    compensator = Compensator(flaky, "replica-a", asyncio.Queue())
    compensator.backoff = Backoff(initial=0.001, maximum=0.002)
    assert await compensator.release(batch.runs) == 2
    assert calls == 3
    assert len(store.in_state(RunState.PENDING)) == 2


async def test_dispatcher_and_compensator_end_with_the_stream() -> None:
    _, store, broker = await world()
    broker.fail_every(1)
    gate = BrokerGate(backoff=Backoff(initial=3600, maximum=3600))
    batches: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue()
    releases: Releases = asyncio.Queue()
    d = asyncio.create_task(Dispatcher(broker, "prod", batches, releases, gate).run())
    c = asyncio.create_task(Compensator(store, "replica-a", releases).run())
    await batches.put(await claimed(store, 2))
    await batches.put(None)
    await asyncio.wait_for(d, 5)
    await releases.put(None)  # as the wiring does once the dispatcher is done
    await asyncio.wait_for(c, 5)
    assert len(store.in_state(RunState.PENDING)) == 2
    assert store.in_state(RunState.CLAIMED) == []


async def test_a_grown_batch_is_published_in_chunks_each_under_its_own_deadline() -> None:
    """The claimer's passes grow for a herd; one publish deadline stays on 500 runs at most."""
    _, store, broker = await world()
    sizes: list[int] = []
    publish_many = broker.publish_many

    async def counted(messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        sizes.append(len(messages))
        return await publish_many(messages)

    broker.publish_many = counted  # type: ignore[method-assign]
    actor, _ = dispatcher(broker, BrokerGate())
    for seconds in range(1200):
        store.add_run("beat", store.clock.now() - timedelta(seconds=seconds))
    batch = ClaimedBatch(tuple(await store.claim_due_runs("replica-a", 1200, LEASE, 10_000)))
    await actor.inbox.put(batch)
    await actor.inbox.put(None)
    await asyncio.wait_for(actor.run(), 5)
    assert sizes == [500, 500, 200]
    assert {m.run_id for m in broker.published} == {r.run_id for r in batch.runs}

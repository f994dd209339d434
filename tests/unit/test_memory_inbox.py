"""The in-memory inbox redelivers as a JetStream consumer with explicit acks would."""

from __future__ import annotations

from actors.testing.memory_inbox import MemoryInbox
from tests.fakes import dispatch
from tests.unit.worker_rig import Seconds


async def test_a_nak_is_delivered_again_after_its_delay_with_its_count_one_higher() -> None:
    seconds = Seconds()
    inbox = MemoryInbox(clock=seconds)
    inbox.put(dispatch("a"))
    [first] = await inbox.fetch(10, 0)
    await first.nak(delay=2.0)
    assert await inbox.fetch(10, 0) == []  # not before its delay
    seconds.now += 2.0
    [again] = await inbox.fetch(10, 0)
    assert (again.message, again.delivery_count) == (first.message, 2)
    await again.ack()
    seconds.now += 100
    assert await inbox.fetch(10, 0) == []
    assert inbox.naked == inbox.acked == [dispatch("a")]


async def test_an_unsettled_delivery_comes_back_after_ack_wait_unless_in_progress() -> None:
    seconds = Seconds()
    inbox = MemoryInbox(ack_wait=5.0, clock=seconds)
    inbox.put(dispatch("a"))
    [first] = await inbox.fetch(10, 0)
    seconds.now += 4.0
    await first.in_progress()  # the timer starts again
    seconds.now += 4.0
    assert await inbox.fetch(10, 0) == []
    seconds.now += 1.0
    [again] = await inbox.fetch(10, 0)
    assert again.delivery_count == 2


async def test_max_deliver_ends_redelivery_and_term_ends_it_at_once() -> None:
    inbox = MemoryInbox(max_deliver=2)
    inbox.put(dispatch("a"))
    inbox.put(dispatch("b"))
    a, b = await inbox.fetch(10, 0)
    await b.term()
    await a.nak()
    [again] = await inbox.fetch(10, 0)
    await again.nak()
    assert await inbox.fetch(10, 0) == []
    assert inbox.termed == [dispatch("b")]
    assert [d.delivery_count for d in inbox.deliveries] == [1, 1, 2]

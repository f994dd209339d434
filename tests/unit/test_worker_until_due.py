"""The worker's wait until due, on the in-memory inbox: runs claimed ahead start at their instant.

The database clock (the worker's estimate) is a fake the test moves; the
store and the inbox answer at once.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import pytest

from actors.domain import StartRefusal
from actors.ports import DispatchMessage
from actors.testing.memory import ManualClock
from tests.fakes import T0
from tests.unit.worker_rig import Rig, until

pytestmark = pytest.mark.timeout(30)

MS = timedelta(milliseconds=1)


def message(run: str, due: datetime | None) -> DispatchMessage:
    return DispatchMessage(
        run_id=run, epoch=1, job="job", scheduled_at=due or T0, attempt=1, deployment="d",
        due_at=due,
    )  # fmt: skip


def started(rig: Rig) -> list[list[str]]:
    return [sorted(m.run_id for m in batch) for batch in rig.store.starts]


async def test_runs_of_one_instant_start_together_when_the_database_clock_reaches_it() -> None:
    rig = Rig(max_hold=timedelta(hours=1))
    rig.executor.finish.set()
    instant = T0 + 20 * MS
    rig.inbox.put(message("now", None))
    rig.inbox.put(message("a", instant))
    rig.start()
    try:
        await until(lambda: len(rig.worker.starter.until_due) == 1, "a held")
        rig.inbox.put(message("b", instant))  # the same instant, a later fetch
        await until(lambda: len(rig.worker.starter.until_due) == 2, "a and b held")
        assert started(rig) == [["now"]]  # the due one at once; a and b wait
        rig.clock.current = instant
        await until(lambda: len(rig.store.starts) == 2, "the instant started")
        assert started(rig)[1] == ["a", "b"]  # one statement for the instant
    finally:
        await rig.stopped()


async def test_a_jump_of_the_database_clock_ends_the_wait_for_a_held_run() -> None:
    # The hold waits on the monotonic clock for a delay computed from the database
    # clock's estimate, and between keep-alives it has no other reason to look
    # again: a jump of the estimate (a skew re-measured, a test's clock moved) must
    # end that wait, or the run, already due, waits out the delay.
    clock = ManualClock(current=T0)
    rig = Rig(clock, max_hold=timedelta(hours=2), keep_held_alive=timedelta(hours=1))
    rig.executor.finish.set()
    rig.inbox.put(message("later", T0 + timedelta(hours=1)))
    rig.start()
    try:
        await until(lambda: len(rig.worker.starter.until_due) == 1, "held")
        clock.advance(timedelta(hours=1))
        await until(lambda: ("start", "later") in rig.store.events, "started at its instant")
    finally:
        await rig.stopped()


async def test_a_run_the_database_calls_early_is_held_again_then_started() -> None:
    rig = Rig(max_hold=timedelta(hours=1))
    rig.executor.finish.set()
    rig.store.not_started["r"] = StartRefusal.EARLY
    rig.inbox.put(message("r", T0))
    rig.start()
    try:
        await until(lambda: len(rig.store.starts) >= 1, "tried once")
        await until(lambda: len(rig.worker.starter.until_due) == 1, "held again")
        assert rig.inbox.acked == []  # not settled: it is still to start
        del rig.store.not_started["r"]
        rig.clock.current = T0 + timedelta(seconds=1)
        await until(lambda: ("start", "r") in rig.store.events, "started on a later try")
    finally:
        await rig.stopped()


async def test_held_runs_are_handed_back_to_the_broker_at_a_stop() -> None:
    rig = Rig(max_hold=timedelta(hours=1))
    rig.inbox.put(message("later", T0 + timedelta(minutes=1)))
    rig.start()
    await until(lambda: len(rig.worker.starter.until_due) == 1, "held")
    await rig.stopped()
    assert [m.run_id for m in rig.inbox.naked] == ["later"]  # for another worker to take
    assert rig.store.starts == []
    assert len(rig.worker.starter.until_due) == 0


async def test_a_herd_claimed_ahead_is_taken_in_by_fetches_of_a_thousand() -> None:
    """Each fetch is a round trip to the broker (and, once due, a start statement):
    a herd of 20,000 in fetches of 256 reached its workers seconds after it was
    published. With the slots free, 1,000 held-ahead deliveries come in one fetch."""
    rig = Rig(max_hold=timedelta(hours=1), concurrency=1000)
    instant = T0 + timedelta(minutes=1)
    for i in range(1000):
        rig.inbox.put(message(f"r{i}", instant))
    rig.start()
    try:
        await until(lambda: len(rig.worker.starter.until_due) == 1000, "the herd held")
        assert rig.inbox.fetches <= 2  # the one that brought them, and the next one waiting
    finally:
        await rig.stopped()


async def test_held_runs_whose_start_was_slow_get_a_fresh_word_to_the_broker() -> None:
    """A held delivery's last word comes just before its release; a start that takes
    longer than keep_held_alive (forced: the start statement waits on a gate) must
    tell the broker at once, or ack_wait runs out before the first heartbeat and the
    run comes back as a redelivery that changes nothing."""
    keep = timedelta(milliseconds=50)
    rig = Rig(max_hold=timedelta(hours=1), keep_held_alive=keep)
    gate = asyncio.Event()
    start = rig.store.start_runs
    asked: list[float] = []

    async def gated(*args: object, **kwargs: object) -> object:
        asked.append(time.monotonic())
        await gate.wait()
        return await start(*args, **kwargs)  # type: ignore[arg-type]

    rig.store.start_runs = gated  # type: ignore[method-assign,assignment]
    instant = T0 + 20 * MS
    rig.inbox.put(message("slow", instant))
    rig.start()
    try:
        await until(lambda: len(rig.worker.starter.until_due) == 1, "held")
        rig.clock.current = instant
        await until(lambda: asked != [], "the start asked for")
        delivery = rig.inbox.deliveries[0]
        await until(lambda: time.monotonic() - asked[0] > 2 * keep.total_seconds(), "time")
        marks = delivery.progress_marks  # no keep-alive of the hold comes after its release
        gate.set()
        await until(lambda: ("start", "slow") in rig.store.events, "started")
        await until(lambda: delivery.progress_marks > marks, "a fresh word after the slow start")
    finally:
        rig.executor.finish.set()
        await rig.stopped()


async def test_held_runs_started_at_once_send_no_extra_word() -> None:
    rig = Rig(max_hold=timedelta(hours=1), keep_held_alive=timedelta(hours=1))
    instant = T0 + 20 * MS
    rig.inbox.put(message("quick", instant))
    rig.start()
    try:
        await until(lambda: len(rig.worker.starter.until_due) == 1, "held")
        delivery = rig.inbox.deliveries[0]
        marks = delivery.progress_marks
        rig.clock.current = instant
        await until(lambda: ("start", "quick") in rig.store.events, "started")
        await until(lambda: rig.executor.calls != [], "executing")
        assert delivery.progress_marks == marks
    finally:
        rig.executor.finish.set()
        await rig.stopped()

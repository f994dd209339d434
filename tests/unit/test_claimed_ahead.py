"""The worker's hold: runs claimed ahead wait until their instant, then start by instant.

A fake clock (the database's time as the worker estimates it) moves by hand;
nothing here waits for real time to pass.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from actors.ports import DispatchMessage
from actors.worker.claimed_ahead import EARLY_RETRY, ClaimedAhead

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def msg(run: str, due: datetime | None, epoch: int = 1) -> DispatchMessage:
    return DispatchMessage(
        run_id=run, epoch=epoch, job="job", scheduled_at=due or T0, attempt=1, deployment="d",
        due_at=due,
    )  # fmt: skip


def pairs(*messages: DispatchMessage) -> list[tuple[DispatchMessage, str]]:
    return [(m, f"delivery-{m.run_id}") for m in messages]


def ids(batch: list[tuple[DispatchMessage, str]]) -> list[str]:
    return [m.run_id for m, _ in batch]


def test_due_runs_and_runs_without_due_at_start_now_the_others_are_held() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    now = hold.split(pairs(msg("old", None), msg("due", T0), msg("later", T0 + 500 * MS)), room=10)
    assert ids(now) == ["old", "due"]
    assert len(hold) == 1
    assert ("later", 1) in hold
    assert hold.next_release() == T0 + 500 * MS


def test_nothing_is_released_before_its_instant_and_an_instant_comes_out_whole() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    a = T0 + 300 * MS
    b = T0 + 600 * MS
    hold.split(pairs(msg("b1", b), msg("a1", a), msg("b2", b)), room=10)
    hold.split(pairs(msg("a2", a), msg("a3", a)), room=10)  # a later fetch, same instant
    clock.now = a - MS
    assert hold.due(100) == []
    clock.now = a
    assert sorted(ids(hold.due(100))) == ["a1", "a2", "a3"]  # one start statement
    assert hold.next_release() == b
    clock.now = b + 10 * S
    assert sorted(ids(hold.due(100))) == ["b1", "b2"]
    assert len(hold) == 0
    assert hold.next_release() is None


def test_the_earliest_instant_goes_first_when_slots_are_short() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    hold.split(pairs(msg("late", T0 + 200 * MS), msg("early", T0 + 100 * MS)), room=10)
    clock.now = T0 + S
    assert ids(hold.due(1)) == ["early"]
    assert ids(hold.due(0)) == []
    assert ids(hold.due(1)) == ["late"]


def test_due_runs_beyond_the_free_slots_wait_in_the_hold_as_due() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    now = hold.split(pairs(msg("r1", T0), msg("r2", T0), msg("r3", None)), room=1)
    assert ids(now) == ["r1"]
    assert hold.next_release() == T0  # due already: started as soon as a slot frees
    assert sorted(ids(hold.due(5))) == ["r2", "r3"]


def test_a_hold_lasts_at_most_max_hold_the_database_says_whether_it_is_due() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    hold.split(pairs(msg("far", T0 + timedelta(minutes=5))), room=10)
    assert hold.next_release() == T0 + S


def test_a_redelivered_copy_replaces_the_held_delivery_and_is_not_started() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    m = msg("r", T0 + 100 * MS)
    hold.split([(m, "first")], room=10)
    assert hold.split([(m, "second")], room=10) == []
    clock.now = T0 + 100 * MS
    assert hold.due(10) == [(m, "second")]


def test_early_runs_are_held_again_a_little_longer_each_time() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    m = msg("r", T0)
    hold.again(m, "d")
    assert hold.next_release() == T0 + EARLY_RETRY
    clock.now = T0 + EARLY_RETRY
    assert hold.due(1) == [(m, "d")]
    hold.again(m, "d")  # refused again
    assert hold.next_release() == clock.now + 2 * EARLY_RETRY


def test_take_all_empties_the_hold() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    hold.split(pairs(msg("a", T0 + MS), msg("b", T0 + 2 * MS)), room=10)
    assert sorted(ids(hold.take_all())) == ["a", "b"]
    assert len(hold) == 0


async def test_the_loop_starts_each_instant_in_one_call_within_the_free_slots() -> None:
    clock = FakeClock()
    hold: ClaimedAhead[str] = ClaimedAhead(clock, max_hold=S)
    started: list[list[str]] = []
    got = asyncio.Event()
    slots = {"free": 2}
    slot_freed = asyncio.Event()

    async def start(batch: list[tuple[DispatchMessage, str]]) -> None:
        started.append(sorted(ids(batch)))
        slots["free"] -= len(batch)
        got.set()

    hold.open()
    hold.split(pairs(msg("x1", T0 + 100 * MS), msg("x2", T0 + 100 * MS)), room=10)
    hold.split(pairs(msg("y1", T0 + 100 * MS)), room=10)
    loop = asyncio.create_task(hold.run(start, lambda: slots["free"], slot_freed, asyncio.Lock()))
    try:
        clock.now = T0 + 100 * MS
        hold.split(pairs(msg("z", T0 + S)), room=10)  # an arrival: the loop looks again
        await asyncio.wait_for(got.wait(), 5)
        assert started == [["x1", "x2"]]  # two slots: two of the instant's three
        got.clear()
        slots["free"] = 1
        slot_freed.set()  # a run finished
        await asyncio.wait_for(got.wait(), 5)
        assert started[-1] == ["y1"]
        assert len(hold) == 1  # z is not due yet
    finally:
        hold.close()
        await asyncio.wait_for(loop, 5)


# -- keeping held deliveries from redelivery ---------------------------------------------


def _keeping(clock: FakeClock) -> tuple[ClaimedAhead[str], list[str]]:
    told: list[str] = []

    async def keep_alive(delivery: str) -> None:
        told.append(delivery)

    hold: ClaimedAhead[str] = ClaimedAhead(
        clock, max_hold=timedelta(minutes=1), keep_alive=keep_alive, keep_alive_every=S
    )
    return hold, told


def _age(hold: ClaimedAhead[str], run: str, seconds: float) -> None:
    """Pretend the delivery's last word to the broker was ``seconds`` ago."""
    hold._held[(run, 1)].marked = time.monotonic() - seconds


async def test_a_held_delivery_is_kept_alive_once_a_period() -> None:
    clock = FakeClock()
    hold, told = _keeping(clock)
    hold.split(pairs(msg("far", T0 + timedelta(seconds=10))), room=10)
    assert await hold.keep_alive_due() is not None
    assert told == []  # just delivered: its word is fresh
    _age(hold, "far", 1.1)
    await hold.keep_alive_due()
    assert told == ["delivery-far"]
    await hold.keep_alive_due()
    assert told == ["delivery-far"]  # once a period, not at every look


async def test_a_delivery_about_to_be_released_gets_a_fresh_word_first() -> None:
    # Started, executed and heartbeated after its release: all of that must come
    # within ack_wait of its last word, so that word is at most half a period old.
    clock = FakeClock()
    hold, told = _keeping(clock)
    hold.split(pairs(msg("soon", T0 + 300 * MS), msg("later", T0 + timedelta(seconds=10))), room=10)
    _age(hold, "soon", 0.6)
    _age(hold, "later", 0.6)
    await hold.keep_alive_due()
    assert told == ["delivery-soon"]


async def test_due_runs_start_while_the_broker_has_not_answered_a_keep_alive() -> None:
    """A herd's keep-alives (thousands of replies to the broker) go out beside the
    starts: a start does not wait for them."""
    clock = FakeClock()
    answered = asyncio.Event()  # the broker never answers within this test
    told: list[str] = []

    async def keep_alive(delivery: str) -> None:
        told.append(delivery)
        await answered.wait()

    hold: ClaimedAhead[str] = ClaimedAhead(
        clock, max_hold=timedelta(minutes=1), keep_alive=keep_alive, keep_alive_every=S
    )
    started: list[list[str]] = []
    got = asyncio.Event()

    async def start(batch: list[tuple[DispatchMessage, str]]) -> None:
        started.append(sorted(ids(batch)))
        got.set()

    hold.open()
    hold.split(pairs(msg("waiting", T0 + timedelta(seconds=30))), room=10)
    _age(hold, "waiting", 1.1)  # its keep-alive is due at the first look
    loop = asyncio.create_task(hold.run(start, lambda: 10, asyncio.Event(), asyncio.Lock()))
    try:
        clock.now = T0 + 100 * MS
        hold.split(pairs(msg("due", T0 + 100 * MS)), room=0)  # due, held for a slot
        await asyncio.wait_for(got.wait(), 5)
        assert started == [["due"]]
        assert told == ["delivery-waiting"]  # sent, still unanswered
    finally:
        answered.set()
        hold.close()
        await asyncio.wait_for(loop, 5)


async def test_releasing_an_instant_a_batch_at_a_time_does_not_look_at_every_keep_alive() -> None:
    """An instant of 5,000 held runs released 100 at a time is 50 turns of the loop:
    the keep-alive look (two passes over everything held) is not made at each."""
    clock = FakeClock()
    hold, _ = _keeping(clock)
    looks = {"n": 0}
    look = hold._keep_alive_beside

    def counted() -> float | None:
        looks["n"] += 1
        return look()

    hold._keep_alive_beside = counted  # type: ignore[method-assign]
    hold.split(pairs(*(msg(f"r{i}", T0 + S) for i in range(5000))), room=0)
    started: list[int] = []
    done = asyncio.Event()

    async def start(batch: list[tuple[DispatchMessage, str]]) -> None:
        started.append(len(batch))
        if sum(started) == 5000:
            done.set()

    clock.now = T0 + S
    loop = asyncio.create_task(hold.run(start, lambda: 100, asyncio.Event(), asyncio.Lock()))
    try:
        await asyncio.wait_for(done.wait(), 5)
        assert len(started) == 50
        assert looks["n"] < 10  # once, and again only when 0.1 s went by
    finally:
        hold.close()
        await asyncio.wait_for(loop, 5)

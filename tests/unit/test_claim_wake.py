"""The claimer's wake: how long it rests, and which notifications cut a rest short.

Fakes for the store and the gate; no server, no real waiting.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import cast

from actors.adapters.postgres.notify import parse_pending
from actors.pacing import BrokerGate, ClaimedBatch
from actors.ports import RunStore
from actors.scheduling.claimer import Claimer
from actors.scheduling.runtime import Runtime
from actors.testing.memory import ManualClock

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def claimer(ahead: timedelta = 500 * MS, interval: timedelta = timedelta(seconds=5)) -> Claimer:
    outbox: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue()
    return Claimer(
        cast(RunStore, object()),
        "me",
        outbox,
        cast(BrokerGate, object()),
        batch=10,
        lease=timedelta(minutes=2),
        max_claimed=100,
        interval=interval,
        stop=asyncio.Event(),
        ahead=ahead,
        wake=True,
        runtime=Runtime(ManualClock(T0)),
    )


def test_it_rests_until_the_next_run_is_claimable_or_the_interval() -> None:
    c = claimer()
    assert c._rest_for(None) == 5.0
    assert c._rest_for(timedelta(seconds=2)) == 1.501  # 2s less 500ms ahead, +1ms
    assert c._rest_for(timedelta(minutes=1)) == 5.0


async def test_a_notified_run_due_before_the_rest_ends_wakes_it_a_later_one_does_not() -> None:
    c = claimer()
    c._rest_until = T0 + timedelta(seconds=1)
    c.run_pending(T0 + timedelta(seconds=2))  # claimable at +1.5s: after the rest
    assert not c._woken.is_set()
    c.run_pending(T0 + 1400 * MS)  # claimable at +900ms: before the rest ends
    assert c._woken.is_set()


async def test_a_notification_during_a_pass_wakes_the_next_rest_at_once() -> None:
    c = claimer()
    c.run_pending(T0 + timedelta(minutes=5))  # no rest under way: the pass may have missed it
    assert c._woken.is_set()
    await asyncio.wait_for(c._rest(60.0), 5)  # returns at once


async def test_the_listener_s_look_now_wakes_a_rest() -> None:
    c = claimer()
    c._rest_until = T0 + timedelta(seconds=1)
    due = parse_pending("mine garbled", "mine")  # our schema, an unreadable instant: look now
    assert due is not None
    c.run_pending(due)
    assert c._woken.is_set()


def test_notifications_of_other_schemas_are_ignored() -> None:
    assert parse_pending("other 1764590400.5", "mine") is None
    assert parse_pending("mine 1764590400.5", "mine") == datetime(
        2025, 12, 1, 12, 0, 0, 500000, tzinfo=UTC
    )

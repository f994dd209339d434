"""The pause between an actor's rounds: a stop ends it at once, otherwise the interval does."""

from __future__ import annotations

import asyncio

from actors.pacing import wait_for_stop


async def test_a_stop_already_set_returns_true_without_waiting_the_interval() -> None:
    stop = asyncio.Event()
    stop.set()
    # An hour-long interval: the test would time out if the stop did not end the wait.
    assert await wait_for_stop(stop, 3600.0) is True


async def test_a_stop_set_during_the_wait_ends_it() -> None:
    stop = asyncio.Event()
    waiting = asyncio.create_task(wait_for_stop(stop, 3600.0))
    await asyncio.sleep(0)  # let the wait begin
    assert not waiting.done()
    stop.set()
    assert await asyncio.wait_for(waiting, 10.0) is True


async def test_the_interval_passing_returns_false() -> None:
    assert await wait_for_stop(asyncio.Event(), 0.001) is False

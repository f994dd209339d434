"""Calls handed to an event loop from another thread: all run, in order, with few wake-ups."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from actors.adapters.executors.handoff import SLICE, Handoff


async def test_a_herd_of_calls_runs_in_order_on_few_wake_ups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    wake_ups = 0
    threadsafe = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> asyncio.Handle:
        nonlocal wake_ups
        wake_ups += 1
        return threadsafe(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    handoff = Handoff(loop)
    ran: list[int] = []
    n = 3 * SLICE + 7
    all_ran = asyncio.Event()

    def note(i: int) -> None:
        ran.append(i)
        if len(ran) == n:
            all_ran.set()

    def hand() -> None:
        for i in range(n):
            handoff.call(functools.partial(note, i))

    thread = threading.Thread(target=hand)
    thread.start()
    async with asyncio.timeout(30):
        await all_ran.wait()
    thread.join()
    assert ran == list(range(n))
    assert wake_ups < n // 10  # one per batch waiting, not one per call


async def test_a_call_that_raises_does_not_drop_the_others() -> None:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: seen.append(context))
    handoff = Handoff(loop)
    done = asyncio.Event()

    def boom() -> None:
        raise ValueError("a bug in one call")

    handoff.call(boom)
    handoff.call(done.set)
    async with asyncio.timeout(10):
        await done.wait()
    assert [type(c["exception"]) for c in seen] == [ValueError]

"""The runtime every scheduling actor is handed (actors.scheduling.runtime): its clocks
are the ones the actor reads, not the host's."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import cast

from actors.pacing import BrokerGate
from actors.ports import RunStore
from actors.scheduling.claimer import Claimer
from actors.scheduling.reaper import Reaper
from actors.scheduling.runtime import Runtime
from actors.testing.memory import InMemoryRunStore, ManualClock


async def test_the_reaper_prunes_on_the_runtimes_monotonic_clock() -> None:
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    seconds = [100.0]
    prunes: list[float] = []
    stop = asyncio.Event()
    reaper = Reaper(
        store,
        timedelta(0),
        stop,
        retention=timedelta(days=1),
        runtime=Runtime(clock, monotonic=lambda: seconds[0]),
    )

    async def prune_once() -> int:
        prunes.append(seconds[0])
        if len(prunes) == 1:
            seconds[0] += 5.0  # not yet PRUNE_EVERY (10 s) since: no prune on the next pass
        elif len(prunes) == 2:
            stop.set()
        return 0

    passes = 0

    async def reap_once() -> int:
        nonlocal passes
        passes += 1
        if passes == 3:
            seconds[0] += 5.0  # now 10 s since the first prune
        return 0

    reaper.prune_once = prune_once  # type: ignore[method-assign]
    reaper.reap_once = reap_once  # type: ignore[method-assign]
    async with asyncio.timeout(5):
        await reaper.run()
    assert prunes == [100.0, 110.0]
    assert passes == 3


def test_the_claimer_rests_on_the_runtimes_database_clock() -> None:
    clock = ManualClock()
    claimer = Claimer(
        cast(RunStore, object()),
        "me",
        asyncio.Queue(),
        cast(BrokerGate, object()),
        batch=10,
        lease=timedelta(minutes=2),
        max_claimed=100,
        interval=timedelta(seconds=5),
        stop=asyncio.Event(),
        runtime=Runtime(clock),
    )
    assert claimer.clock() == clock.now()
    clock.advance(timedelta(hours=1))
    assert claimer.clock() == clock.now()

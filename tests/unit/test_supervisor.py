"""The supervisor's restart policy: crashes count, outages do not."""

from __future__ import annotations

import pytest

from actors.flow import Backoff
from actors.ports import StoreUnavailable
from actors.supervisor import ActorGaveUp, supervise

FAST = Backoff(initial=0.001, maximum=0.002)


async def test_an_actor_that_keeps_crashing_makes_the_supervisor_give_up() -> None:
    calls = 0

    async def crashing() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug")

    with pytest.raises(ActorGaveUp):
        await supervise("x", crashing, max_restarts=5, window=60, backoff=FAST)
    assert calls == 6


async def test_a_crash_is_restarted_and_the_actor_may_then_finish() -> None:
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RuntimeError("transient bug")

    await supervise("x", flaky, max_restarts=5, window=60, backoff=FAST)
    assert calls == 3


async def test_outages_are_waited_out_however_many_and_never_give_up() -> None:
    calls = 0

    async def database_restarting() -> None:
        nonlocal calls
        calls += 1
        if calls <= 20:  # far more than the crash budget
            raise StoreUnavailable("connection refused")

    await supervise(
        "x",
        database_restarting,
        max_restarts=5,
        window=60,
        backoff=FAST,
        outage_backoff=Backoff(initial=0.001, maximum=0.002),
    )
    assert calls == 21

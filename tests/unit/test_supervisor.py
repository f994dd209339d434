"""The supervisor's restart policy: crashes count, outages do not."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from actors.pacing import Backoff
from actors.ports import StoreUnavailable
from actors.scheduling.supervisor import ActorGaveUp, supervise
from tests.unit.memory_world import until

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


async def test_restarts_inside_one_outage_are_said_once_and_counted_when_it_ends() -> None:
    # A read-only database: the actor stops on its first write every time it is
    # restarted. One line when the outage begins for it, one when it is over.
    calls = 0
    fail_again = asyncio.Event()

    async def writes_refused() -> None:
        nonlocal calls
        calls += 1
        if calls in (1, 2, 3, 5, 6):
            raise StoreUnavailable("cannot execute INSERT in a read-only transaction")
        if calls == 4:  # runs until the test lets the outage come back
            await fail_again.wait()
            raise StoreUnavailable("cannot execute INSERT in a read-only transaction")

    def outages() -> float:
        return REGISTRY.get_sample_value("claimd_actor_outages_total", {"actor": "worker"}) or 0.0

    counted = outages()
    with capture_logs() as logs:

        def warnings() -> list[str]:
            return [e["event"] for e in logs if e["log_level"] == "warning"]

        task = asyncio.create_task(
            supervise(
                "worker",
                writes_refused,
                outage_backoff=Backoff(initial=0.001, maximum=0.002),
                settled_after=0.05,
            )
        )
        await until(lambda: len(warnings()) == 2, "the first outage over")
        fail_again.set()
        await asyncio.wait_for(task, 5)
    said = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["event"], e.get("restarts"), e.get("how")) for e in said] == [
        ("server unavailable; actor restarts when it is back", None, None),
        ("actor running again after a server outage", 3, "ran"),
        ("server unavailable; actor restarts when it is back", None, None),
        ("actor running again after a server outage", 3, "finished"),
    ]
    assert {e["name"] for e in said} == {"worker"}
    assert "read-only" in said[1]["error"]
    assert outages() - counted == 6  # every restart counted


class SteppingClock:
    """A monotonic clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


async def test_crashes_further_apart_than_the_window_never_exhaust_the_budget() -> None:
    calls = 0

    async def crashes_now_and_then() -> None:
        nonlocal calls
        calls += 1
        if calls <= 8:  # far more than the budget of 2
            raise RuntimeError("rare bug")

    # Each crash is 40 s after the previous one (two clock reads per run):
    # never more than two in a 60 s window.
    await supervise(
        "x",
        crashes_now_and_then,
        max_restarts=2,
        window=60,
        backoff=FAST,
        monotonic=SteppingClock(20.0),
    )
    assert calls == 9


async def test_a_burst_inside_the_window_gives_up_at_the_budget_plus_one() -> None:
    calls = 0

    async def crashing() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug")

    with pytest.raises(ActorGaveUp, match="3 times in 60"):
        await supervise(
            "x", crashing, max_restarts=2, window=60, backoff=FAST, monotonic=SteppingClock(1.0)
        )
    assert calls == 3


async def test_a_long_healthy_run_starts_the_backoff_from_the_bottom() -> None:
    backoff = Backoff(initial=0.001, maximum=0.002)
    seen: list[int] = []

    async def crashes_after_running_long() -> None:
        seen.append(backoff.failures)
        if len(seen) < 4:
            raise RuntimeError("bug after a healthy hour")

    await supervise(
        "x",
        crashes_after_running_long,
        max_restarts=10,
        window=1,
        backoff=backoff,
        monotonic=SteppingClock(3600.0),
    )
    # Reset before each delay: the count never grows past one.
    assert seen == [0, 1, 1, 1]


async def test_cancellation_goes_through_the_supervisor() -> None:
    started = asyncio.Event()
    calls = 0

    async def waits_forever() -> None:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(supervise("x", waits_forever, backoff=FAST))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1  # not restarted

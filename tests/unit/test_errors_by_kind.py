"""Errors by kind inside the actors: outages are waited out, anything else is raised.

Fakes of the ports, for the actors' own logic; the distributed behaviour (a run
whose completion fails is recovered by its lease) is proved on the real servers
in tests/integration/test_completion_rejected.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from actors.domain import ClaimedRun, ExecutionResult, Outcome
from actors.ports import Completion, DispatchMessage, RunStore, StoreUnavailable
from actors.scheduling.compensator import Compensator
from actors.worker import Worker, WorkerSettings
from actors.worker.heartbeat import Heartbeat, InFlight
from actors.worker.holding import Pending
from tests.fakes import RecordingDelivery as Delivery


async def _beats_until(heartbeat: Heartbeat, calls: list[int], count: int) -> None:
    task = asyncio.create_task(heartbeat.run())
    try:
        async with asyncio.timeout(10):
            while len(calls) < count and not task.done():
                await asyncio.sleep(0.001)
    finally:
        heartbeat.stop.set()
    await task


async def test_a_heartbeat_waits_out_an_outage_and_goes_on_beating() -> None:
    calls: list[int] = []

    async def extend(runs: Any) -> set[tuple[str, int]]:
        calls.append(len(runs))
        if len(calls) <= 3:
            raise StoreUnavailable("connection refused")
        return {("r", 1)}

    in_flight = {("r", 1): InFlight("r", 1, "job", Delivery())}
    heartbeat = Heartbeat(
        extend, in_flight, timedelta(milliseconds=1), asyncio.Event(), outage=StoreUnavailable
    )
    await _beats_until(heartbeat, calls, 5)
    assert len(calls) >= 5


async def test_deliveries_are_kept_while_an_extension_waits_for_its_answer() -> None:
    """An extension that hangs (a slow or silent database) does not stop the
    in_progress marks: otherwise JetStream redelivers a run executing here
    after ack_wait, a copy that changes nothing (seen in CI on a loaded machine)."""
    answer = asyncio.Event()
    calls: list[int] = []

    async def extend(runs: Any) -> set[tuple[str, int]]:
        calls.append(len(runs))
        await answer.wait()
        return {("r", 1)}

    delivery = Delivery()
    in_flight = {("r", 1): InFlight("r", 1, "job", delivery)}
    heartbeat = Heartbeat(
        extend, in_flight, timedelta(milliseconds=1), asyncio.Event(), outage=StoreUnavailable
    )
    task = asyncio.create_task(heartbeat.run())
    async with asyncio.timeout(10):
        while delivery.progress_marks < 5:
            await asyncio.sleep(0.001)
    assert calls == [1]  # one extension at a time: the hung one is not stacked on
    answer.set()
    async with asyncio.timeout(10):
        while len(calls) < 2:
            await asyncio.sleep(0.001)
    heartbeat.stop.set()
    await task


async def test_a_lost_lease_is_no_longer_kept() -> None:
    async def extend(runs: Any) -> set[tuple[str, int]]:
        return set()  # refused: reaped or cancelled

    delivery = Delivery()
    entry = InFlight("r", 1, "job", delivery)
    entry.leased_at -= 1  # its lease set two beats ago and more: extended at this beat
    entry.task = asyncio.create_task(asyncio.sleep(60))
    heartbeat = Heartbeat(
        extend,
        {("r", 1): entry},
        timedelta(milliseconds=1),
        asyncio.Event(),
        outage=StoreUnavailable,
    )
    await heartbeat.beat()
    assert entry.lease_lost
    marks = delivery.progress_marks
    await heartbeat.keep_deliveries()
    assert delivery.progress_marks == marks
    with pytest.raises(asyncio.CancelledError):
        await entry.task


async def test_a_heartbeat_that_fails_for_another_reason_raises_to_its_owner() -> None:
    calls: list[int] = []

    async def extend(runs: Any) -> set[tuple[str, int]]:
        calls.append(len(runs))
        raise RuntimeError("bug in the heartbeat")

    in_flight = {("r", 1): InFlight("r", 1, "job", Delivery())}
    heartbeat = Heartbeat(
        extend, in_flight, timedelta(milliseconds=1), asyncio.Event(), outage=StoreUnavailable
    )
    with pytest.raises(RuntimeError, match="bug in the heartbeat"):
        async with asyncio.timeout(10):
            await heartbeat.run()
    assert calls == [1]


class ReleasingStore:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def release_unpublished(self, owner: str, runs: Any) -> int:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return len(runs)


def _claimed() -> ClaimedRun:
    return ClaimedRun(run_id="r", epoch=1, job="job", scheduled_at=datetime.now(UTC), attempt=1)


async def test_the_compensator_waits_out_an_outage_but_raises_a_bug() -> None:
    runs = (_claimed(),)
    outage = ReleasingStore([StoreUnavailable("down"), StoreUnavailable("down")])
    compensator = Compensator(cast(RunStore, outage), "me", asyncio.Queue())
    compensator.backoff.initial = compensator.backoff.maximum = 0.001
    assert await compensator.release(runs) == 1
    assert outage.calls == 3

    bug = ReleasingStore([RuntimeError("bug")])
    compensator = Compensator(cast(RunStore, bug), "me", asyncio.Queue())
    with pytest.raises(RuntimeError, match="bug"):
        await compensator.release(runs)
    assert bug.calls == 1


class StartingStore:
    """start_runs only: records what it was asked, fails as told."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.asked: list[list[DispatchMessage]] = []
        self.retake: list[set[tuple[str, int]]] = []

    async def start_runs(
        self,
        worker: str,
        messages: list[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> tuple[list[Any], list[Any]]:
        self.asked.append(list(messages))
        self.retake.append(set(retake))
        if self.error is not None:
            raise self.error
        return [], []


def _message(run_id: str = "r", epoch: int = 1) -> DispatchMessage:
    return DispatchMessage(
        run_id=run_id,
        epoch=epoch,
        job="job",
        scheduled_at=datetime.now(UTC),
        attempt=1,
        deployment="d",
    )


def _worker(store: StartingStore) -> Worker:
    settings = WorkerSettings(
        worker_id="w",
        deployment="d",
        lease=timedelta(seconds=30),
        heartbeat_interval=timedelta(seconds=1),
        concurrency=4,
        grace=timedelta(seconds=1),
    )
    executor = SimpleNamespace(runs_inline=lambda executor: False)  # never executes here
    return Worker(
        cast(RunStore, store), cast(Any, None), cast(Any, executor), settings, stop=asyncio.Event()
    )


async def test_only_a_start_whose_reply_was_lost_is_offered_to_be_taken_up_again() -> None:
    # The rule itself (START_RUNS) is proved on PostgreSQL in
    # tests/integration/test_worker_restart.py; here, what the worker asks for.
    store = StartingStore(StoreUnavailable("reply lost"))
    worker = _worker(store)
    async with asyncio.TaskGroup() as group:
        await worker.handle([Delivery(_message("lost"))], group)
        store.error = None
        await worker.handle([Delivery(_message("lost")), Delivery(_message("other"))], group)
        await worker.handle([Delivery(_message("lost"))], group)
    # Once answered, never again: an attempt begun here is not run twice.
    assert store.retake == [set(), {("lost", 1)}, set()]


async def test_a_start_that_fails_in_an_outage_naks_and_goes_on() -> None:
    store = StartingStore(StoreUnavailable("down"))
    worker = _worker(store)
    delivery = Delivery(_message())
    async with asyncio.TaskGroup() as group:
        await worker.handle([delivery], group)
    assert delivery.settled == ["nak"]


async def test_a_start_that_fails_for_another_reason_naks_and_raises() -> None:
    store = StartingStore(RuntimeError("bug in start"))
    worker = _worker(store)
    delivery = Delivery(_message())
    with pytest.raises(RuntimeError, match="bug in start"):
        # No group: nothing starts, so nothing is spawned into one.
        await worker.handle([delivery], cast(asyncio.TaskGroup, None))
    assert delivery.settled == ["nak"]


async def test_after_a_crash_only_the_runs_with_a_verdict_waiting_stay_heartbeated() -> None:
    worker = _worker(StartingStore())
    never_began = asyncio.create_task(asyncio.sleep(0))
    never_began.cancel()  # cancelled before its first step: its cleanup never ran
    finished = asyncio.create_task(asyncio.sleep(0))
    await asyncio.wait([never_began, finished])
    for run_id, task in (
        ("lost", never_began),
        ("recorded-later", finished),
        ("batch-dropped", finished),
    ):
        worker.in_flight[(run_id, 1)] = InFlight(run_id, 1, "job", Delivery(), task)
    verdict = Completion("recorded-later", 1, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    worker.completions.put_nowait(Pending(verdict, Delivery(), "job"))

    worker._after_crash()

    assert set(worker.in_flight) == {("recorded-later", 1)}
    assert worker.completions.qsize() == 1

"""The worker's steps overlap: fetch beside a start, executions beside recording.

A start waiting for ``start_runs`` does not hold up the next fetch; a slot is
free once its execution ends, while the run stays heartbeated until recorded;
two batches are recorded at once. What must not change with it: a run is
started once, recorded before its message is acked.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

import pytest

from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion, DispatchMessage, NotStarted, StartedRun, StoreUnavailable
from actors.worker.heartbeat import COMPLETIONS
from actors.worker.holding import Holding, Pending
from tests.fakes import RecordingDelivery as Delivery
from tests.fakes import dispatch, sample
from tests.unit.worker_rig import Rig, until

pytestmark = pytest.mark.timeout(30)

Started = tuple[list[StartedRun], list[NotStarted]]


def gate_starts(rig: Rig) -> tuple[asyncio.Event, list[list[str]]]:
    """The first start_runs waits for the event, later ones go through; each listed as sent."""
    gate = asyncio.Event()
    sent: list[list[str]] = []
    start = rig.store.start_runs

    async def gated(
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> Started:
        sent.append([m.run_id for m in messages])
        if len(sent) == 1:
            await gate.wait()
        return await start(worker, messages, lease, retake=retake)

    rig.store.start_runs = gated  # type: ignore[method-assign]
    return gate, sent


def gate_records(rig: Rig) -> tuple[asyncio.Event, list[list[str]]]:
    """Every complete_runs waits for the event; the batches asked for are listed as they come."""
    gate = asyncio.Event()
    asked: list[list[str]] = []
    record = rig.store.complete_runs

    async def gated(completions: Sequence[Completion]) -> set[tuple[str, int]]:
        asked.append([c.run_id for c in completions])
        await gate.wait()
        return await record(completions)

    rig.store.complete_runs = gated  # type: ignore[method-assign]
    return gate, asked


async def test_the_next_fetch_and_start_go_on_while_a_start_waits_for_its_reply() -> None:
    rig = Rig()
    gate, sent = gate_starts(rig)
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: sent == [["a"]], "the first start to be sent")
    rig.inbox.put(dispatch("b"))
    await until(lambda: sent == [["a"], ["b"]], "a second start beside the first")
    await until(lambda: rig.executor.calls == [("b", 1)], "b to execute, a still starting")
    gate.set()
    await until(lambda: sorted(rig.executor.calls) == [("a", 1), ("b", 1)], "a to execute")
    await rig.stopped()
    assert sorted(m.run_id for m in rig.inbox.acked) == ["a", "b"]


async def test_a_copy_fetched_while_its_run_is_being_started_is_not_started_again() -> None:
    # Two starts of one run at once could both send it, and one offer it as a
    # start whose reply was lost (retake): a second execution under one token.
    rig = Rig()
    gate, sent = gate_starts(rig)
    skipped = sample("claimd_deliveries_skipped_total", reason="starting_here")
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: sent == [["a"]], "the first start to be sent")
    rig.inbox.put(message)  # the broker's copy (ack_wait passed)
    await until(lambda: rig.inbox.naked == [message], "the copy to be nak'ed")
    assert sent == [["a"]]
    assert sample("claimd_deliveries_skipped_total", reason="starting_here") == skipped + 1
    gate.set()
    await until(lambda: rig.executor.calls == [("a", 1)], "the run to execute")
    rig.seconds.now += 1.0  # the nak's delay: the copy comes back, finds it executing here
    await until(lambda: rig.inbox.acked == [message], "the copy acked as executing here")
    rig.executor.finish.set()
    await until(lambda: rig.inbox.acked == [message, message], "the run recorded and acked")
    await rig.stopped()
    assert rig.executor.calls == [("a", 1)]
    assert sent == [["a"]]


async def test_a_slot_frees_when_the_execution_ends_and_the_run_is_heartbeated_until_recorded() -> (
    None
):
    rig = Rig(concurrency=1)
    gate, asked = gate_records(rig)
    extended: list[set[tuple[str, int]]] = []
    extend = rig.store.extend_leases

    async def extending(
        worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]:
        extended.append(set(runs))
        return await extend(worker, runs, lease)

    rig.store.extend_leases = extending  # type: ignore[method-assign]
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: rig.executor.calls == [("a", 1)], "a to execute")
    rig.executor.finish.set()
    await until(lambda: asked == [["a"]], "a's verdict to be sent")
    rig.executor.finish.clear()
    rig.inbox.put(dispatch("b"))
    # One slot, a not recorded yet: b executes all the same.
    await until(lambda: rig.executor.calls == [("a", 1), ("b", 1)], "b to execute")
    assert ("a", 1) in rig.worker.in_flight
    await rig.worker.heartbeat.beat()
    assert extended == []  # leases set less than two beats ago are left as they are
    for entry in rig.worker.in_flight.values():
        entry.leased_at -= 1e6  # as if both had run for days
    await rig.worker.heartbeat.beat()
    assert extended[-1] == {("a", 1), ("b", 1)}  # a's lease still extended
    await rig.worker.heartbeat.beat()
    assert len(extended) == 1  # extended just now: not again at the next beat
    assert rig.inbox.acked == []  # nothing acked unrecorded
    gate.set()
    await until(lambda: [m.run_id for m in rig.inbox.acked] == ["a"], "a recorded, then acked")
    assert ("a", 1) not in rig.worker.in_flight
    await rig.stopped()
    assert [m.run_id for m in rig.inbox.acked] == ["a", "b"]


async def test_a_second_batch_is_recorded_while_the_first_waits_for_its_reply() -> None:
    rig = Rig(concurrency=1)
    gate, asked = gate_records(rig)
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: asked == [["a"]], "a's verdict to be sent")
    rig.inbox.put(dispatch("b"))
    await until(lambda: asked == [["a"], ["b"]], "b's verdict sent beside a's")
    assert rig.inbox.acked == []
    gate.set()
    await until(lambda: len(rig.inbox.acked) == 2, "both recorded, then acked")
    await rig.stopped()


async def test_completions_stay_failing_while_any_batch_is_unrecorded() -> None:
    # Another batch recorded does not open the intake while a's verdict still
    # waits for the database: that run would be the one doubled.
    rig = Rig(concurrency=1)
    failing = {"a"}
    record = rig.store.complete_runs

    async def flaky(completions: Sequence[Completion]) -> set[tuple[str, int]]:
        if failing & {c.run_id for c in completions}:
            raise StoreUnavailable("complete: connection refused")
        return await record(completions)

    rig.store.complete_runs = flaky  # type: ignore[method-assign]
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: rig.worker.keeping.trouble() is not None, "a's batch to fail")
    other = Completion("other", 1, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await rig.worker.completer._record([Pending(other, Delivery(), "job")]) == {("other", 1)}
    trouble = rig.worker.keeping.trouble()
    assert trouble is not None
    assert trouble[0] == COMPLETIONS
    failing.clear()
    await until(lambda: [m.run_id for m in rig.inbox.acked] == ["a"], "a recorded at last")
    await until(lambda: rig.worker.keeping.trouble() is None, "the trouble to clear")
    await rig.stopped()


async def test_the_slots_of_a_task_cancelled_before_it_began_are_free_again() -> None:
    # A crash cancels the group before a start just created has run a step:
    # its finally would never run, and the restarted worker would be short of slots.
    holding = Holding(4)
    start = asyncio.create_task(asyncio.sleep(3600))
    holding.take(3)
    start.add_done_callback(functools.partial(holding.given, 3, False))
    execution = asyncio.create_task(asyncio.sleep(3600))
    holding.executing(execution)
    assert holding.busy == 4
    start.cancel()
    execution.cancel()
    await asyncio.wait([start, execution])
    await until(lambda: holding.busy == 0, "every slot given back")


async def test_verdicts_wait_for_the_starts_of_an_instant_then_are_recorded() -> None:
    """At a herd's instant the runs that finished first are not recorded while the
    instant's other runs are still being started (forced: the starts never end
    until the test says so)."""
    rig = Rig(concurrency=1)
    _, asked = gate_records(rig)
    starts_done = asyncio.Event()
    waited: list[float] = []

    async def starts_first(at_most: float) -> None:
        waited.append(at_most)
        await starts_done.wait()

    rig.worker.completer.starts_first = starts_first
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: waited != [], "the completer to ask whether starts are under way")
    await until(lambda: rig.executor.calls == [("a", 1)], "a to execute")
    assert asked == []  # a's verdict waits while the starts go on
    starts_done.set()
    await until(lambda: asked == [["a"]], "a's verdict recorded once the starts ended")
    assert waited[0] <= 1.0  # and a verdict never waits for long
    await rig.stopped()


async def test_held_starts_first_waits_only_while_held_runs_are_being_started() -> None:
    rig = Rig()
    starter = rig.worker.starter
    await asyncio.wait_for(starter.held_starts_first(60), 1)  # none under way: at once
    gate = asyncio.Event()

    async def held_start() -> None:
        await gate.wait()

    task = asyncio.ensure_future(held_start())
    starter._held_starts.add(task)  # a start of held runs, as run_until_due makes one
    starter._held_starts_idle.clear()
    task.add_done_callback(starter._held_start_ended)
    waiting = asyncio.ensure_future(starter.held_starts_first(60))
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.set()
    await asyncio.wait_for(waiting, 1)
    bounded = asyncio.get_running_loop().time()
    starter._held_starts_idle.clear()  # one that never ends: the wait is bounded
    await starter.held_starts_first(0.05)
    assert asyncio.get_running_loop().time() - bounded < 5


async def test_a_run_is_handed_to_its_executor_before_its_start_is_counted_and_logged() -> None:
    """The runs of an instant are begun together: each one's bookkeeping (counters,
    lag, the "run started" line) comes after the executions are under way."""
    rig = Rig()
    counted_at_entry: list[float] = []
    execute = rig.executor.execute

    async def noting(spec: Any, context: Any, timeout: timedelta) -> ExecutionResult:
        counted_at_entry.append(sample("claimd_runs_started_total", claimd_job="early-bird"))
        return await execute(spec, context, timeout)

    rig.executor.execute = noting  # type: ignore[method-assign]
    before = sample("claimd_runs_started_total", claimd_job="early-bird")
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a", job="early-bird"))
    rig.start()
    await until(
        lambda: sample("claimd_runs_started_total", claimd_job="early-bird") == before + 1,
        "the start to be counted",
    )
    assert counted_at_entry == [before]
    await rig.stopped()

"""Intake: a worker fetches nothing it cannot keep, a claimer claims nothing it cannot publish.

Fakes of the ports, for the actors' own decisions. What they buy on the real
servers (fewer duplicate executions, every replica live again after a
blackholed link heals) is shown by the fault harness's network faults
(tests/chaos, ``--faults network``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from actors.domain import ClaimedRun, ExecutionResult, Outcome, RetryPolicy
from actors.pacing import Backoff, BrokerGate, ClaimedBatch, Probe
from actors.ports import (
    Broker,
    DispatchMessage,
    InboxSilent,
    RunStore,
    StartedRun,
    StoreUnavailable,
)
from actors.scheduling.dispatcher import Dispatcher
from actors.worker import Worker, WorkerSettings
from actors.worker.heartbeat import COMPLETIONS, HEARTBEAT, STARTS, Keeping
from tests.fakes import RecordingDelivery as Delivery
from tests.fakes import dispatch

pytestmark = pytest.mark.timeout(30)


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.001)
    assert check(), what


# -- Keeping ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keeping_counts_a_failure_until_its_source_succeeds() -> None:
    keeping = Keeping(timedelta(seconds=2), clock=FakeClock())
    assert keeping.trouble() is None
    keeping.failed(HEARTBEAT, "StoreUnavailable('down')")
    assert keeping.trouble() == (HEARTBEAT, "failing: StoreUnavailable('down')")
    keeping.succeeded(COMPLETIONS)  # another source's success changes nothing
    assert keeping.trouble() is not None
    keeping.succeeded(HEARTBEAT)
    assert keeping.trouble() is None


def test_keeping_counts_a_call_unanswered_past_the_threshold_as_trouble() -> None:
    clock = FakeClock()
    keeping = Keeping(timedelta(seconds=2), clock=clock)
    with keeping.call(HEARTBEAT):
        clock.now += 2.0
        assert keeping.trouble() is None  # slow, not yet stalled
        clock.now += 0.5
        assert keeping.stalled() == (HEARTBEAT, 2.5)
        assert keeping.trouble() == (HEARTBEAT, "no answer for 2.5s")
    assert keeping.trouble() is None  # the call ended


def test_a_probe_answered_clears_beats_and_starts_but_not_unrecorded_verdicts() -> None:
    keeping = Keeping(timedelta(seconds=2), clock=FakeClock())
    for source in (HEARTBEAT, STARTS, COMPLETIONS):
        keeping.failed(source, "down")
    keeping.answered()
    assert keeping.trouble() == (COMPLETIONS, "failing: down")


async def test_an_answered_probe_cuts_the_completers_rest_short() -> None:
    keeping = Keeping(timedelta(seconds=2))
    resting = asyncio.create_task(keeping.rest(3600))
    await asyncio.sleep(0)  # let it start resting
    keeping.answered()
    await asyncio.wait_for(resting, 10)


# -- Probe --------------------------------------------------------------------------------


async def test_a_probe_says_whether_the_call_answered() -> None:
    answers: list[Exception | None] = [None, ConnectionError("refused")]

    async def call() -> None:
        error = answers.pop(0)
        if error is not None:
            raise error

    probe = Probe(call, timeout=5)
    assert await probe() is True
    assert await probe() is False
    assert "refused" in probe.last_error


async def test_a_probe_keeps_its_deadline_and_never_stacks_calls_on_a_dead_link() -> None:
    started = 0
    release = asyncio.Event()

    async def hangs() -> None:
        nonlocal started
        started += 1
        # Even a cancellation is ignored until released: a cleanup stuck on a silent link.
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    probe = Probe(hangs, timeout=0.01)
    assert await probe() is False
    assert await probe() is False
    assert started == 1  # the second probe waited for the first call, no new one
    release.set()
    await _until(lambda: probe._task is not None and probe._task.done(), "the call to end")


# -- BrokerGate ---------------------------------------------------------------------------


async def test_the_gate_stays_closed_until_the_probe_answers() -> None:
    answered = asyncio.Event()
    probes = 0

    async def call() -> None:
        nonlocal probes
        probes += 1
        if not answered.is_set():
            raise ConnectionError("no pong")

    gate = BrokerGate(
        backoff=Backoff(initial=0.001, maximum=0.001),
        probe=Probe(call, 1),
        probe_every=Backoff(initial=0.001, maximum=0.001),
    )
    gate.failed()
    assert not gate.is_open
    await _until(lambda: probes >= 3, "a few unanswered probes")
    assert not gate.is_open  # the old gate opened after its delay whatever the broker did
    answered.set()
    await asyncio.wait_for(gate.wait_open(), 10)
    assert gate.backoff.failures == 1  # only a publish that succeeds resets the backoff


async def test_a_successful_publish_opens_the_gate_and_resets_its_backoff() -> None:
    async def never() -> None:
        raise ConnectionError("no pong")

    gate = BrokerGate(probe=Probe(never, 1))
    gate.failed()
    gate.failed()
    gate.succeeded()
    assert gate.is_open
    assert gate.backoff.failures == 0


class FailingBroker:
    def __init__(self) -> None:
        self.published: list[list[DispatchMessage]] = []

    async def publish_many(self, messages: Any) -> list[BaseException | None]:
        self.published.append(list(messages))
        return [TimeoutError("publish timed out")] * len(messages)


def _claimed(run_id: str) -> ClaimedRun:
    return ClaimedRun(run_id=run_id, epoch=1, job="job", scheduled_at=datetime.now(UTC), attempt=1)


async def test_while_the_gate_is_closed_claimed_batches_go_back_unpublished() -> None:
    async def never() -> None:
        raise ConnectionError("no pong")

    broker = FailingBroker()
    released: asyncio.Queue[tuple[ClaimedRun, ...] | None] = asyncio.Queue()
    gate = BrokerGate(probe=Probe(never, 1))
    dispatcher = Dispatcher(cast(Broker, broker), "d", asyncio.Queue(), released, gate)
    await dispatcher.dispatch(ClaimedBatch((_claimed("a"), _claimed("b"))))
    assert not gate.is_open
    # Claimed before the gate closed: released at once, not published behind a timeout.
    failed = await dispatcher.dispatch(ClaimedBatch((_claimed("c"),)))
    assert [r.run_id for r in failed] == ["c"]
    assert len(broker.published) == 1
    assert [
        [r.run_id for r in runs]
        for runs in (released.get_nowait(), released.get_nowait())
        if runs is not None
    ] == [["a", "b"], ["c"]]


# -- Worker -------------------------------------------------------------------------------


class Store:
    """The worker's side of the store, with the database's answers switched by the test."""

    def __init__(self) -> None:
        self.leases_extend = True
        self.verdicts_record = True
        self.pings_answer = True
        self.extend_failures = 0
        self.record_failures = 0
        self.recorded: list[tuple[str, int]] = []

    async def ping(self) -> None:
        if not self.pings_answer:
            raise StoreUnavailable("ping: connection refused")

    async def start_runs(
        self, worker: str, messages: list[DispatchMessage], lease: timedelta, retake: Any = ()
    ) -> tuple[list[StartedRun], list[Any]]:
        return [
            StartedRun(
                m.run_id,
                m.epoch,
                m.job,
                m.scheduled_at,
                m.attempt,
                3,
                cast(Any, None),
                timedelta(seconds=60),
                RetryPolicy(),
            )
            for m in messages
        ], []

    async def extend_leases(self, worker: str, runs: Any, lease: timedelta) -> set[tuple[str, int]]:
        if not self.leases_extend:
            self.extend_failures += 1
            raise StoreUnavailable("extend: connection refused")
        return set(runs)

    async def complete_runs(self, completions: Any) -> set[tuple[str, int]]:
        if not self.verdicts_record:
            self.record_failures += 1
            raise StoreUnavailable("complete: connection refused")
        keys = [(c.run_id, c.epoch) for c in completions]
        self.recorded += keys
        return set(keys)

    async def interrupt_runs(self, worker: str, runs: Any) -> int:
        return len(runs)


class Executor:
    """Each execution waits until the test lets it finish."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.started = 0

    def runs_inline(self, executor: str | None) -> bool:
        return False

    async def execute(self, spec: Any, context: Any, timeout: timedelta) -> ExecutionResult:
        self.started += 1
        await self.finish.wait()
        return ExecutionResult(Outcome.SUCCEEDED)


class Inbox:
    """One message per fetch while ``messages`` lasts, then empty fetches.

    Each fetch records ``judge()`` at the moment it was made (whether the
    worker should not have fetched then). While ``broker_up`` is false a
    fetch says the broker is silent, and ``reconnect`` that it still is.
    """

    def __init__(self, messages: int, judge: Callable[[], bool]) -> None:
        self.left = messages
        self.judge = judge
        self.fetches = 0
        self.fetched_when_it_should_not = 0
        self.broker_up = True
        self.reconnects = 0

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        self.fetches += 1
        if self.judge():
            self.fetched_when_it_should_not += 1
        await asyncio.sleep(0.001)  # the fake's latency, not a synchronisation
        if not self.broker_up:
            raise InboxSilent("no answer to a ping after empty fetches")
        if self.left > 0:
            self.left -= 1
            return [Delivery(dispatch(f"run-{self.left}"))]
        return []

    async def reconnect(self) -> bool:
        self.reconnects += 1
        return self.broker_up


def _worker(store: Store, inbox: Inbox, executor: Executor, stop: asyncio.Event) -> Worker:
    settings = WorkerSettings(
        worker_id="w",
        deployment="d",
        lease=timedelta(seconds=30),
        heartbeat_interval=timedelta(milliseconds=5),
        concurrency=8,
        grace=timedelta(seconds=5),
        stall_after=timedelta(seconds=5),
    )
    return Worker(cast(RunStore, store), inbox, executor, settings, stop=stop)


async def _stopped(worker: Worker, task: asyncio.Task[None], executor: Executor) -> None:
    worker.stop.set()
    executor.finish.set()
    await asyncio.wait_for(task, 10)


async def test_a_worker_whose_leases_cannot_be_extended_fetches_nothing_until_they_can() -> None:
    store, executor, stop = Store(), Executor(), asyncio.Event()
    inbox = Inbox(messages=2, judge=lambda: store.extend_failures > 0 and not store.leases_extend)
    worker = _worker(store, inbox, executor, stop)
    store.leases_extend = False
    store.pings_answer = False
    task = asyncio.create_task(worker.run())
    await _until(lambda: store.extend_failures >= 3, "heartbeats to fail")
    fetches = inbox.fetches
    await _until(lambda: worker.keeping.trouble() is not None, "the worker to see it")
    # The database comes back: the probe answers, beats go through, fetching resumes.
    store.pings_answer = store.leases_extend = True
    await _until(lambda: inbox.fetches > fetches, "fetching to resume")
    await _stopped(worker, task, executor)
    assert inbox.fetched_when_it_should_not == 0
    assert executor.started == 2


async def test_unrecorded_verdicts_hold_the_worker_even_when_the_database_answers_pings() -> None:
    store, executor, stop = Store(), Executor(), asyncio.Event()
    # Judged on what the worker knows: from the completer's report of a failed
    # record until its report of one that got through. (The fake store's own
    # failure count is a few loop steps ahead of that: complete_runs runs
    # shielded, in a task of its own, and a fetch in between is no fault.)
    reported = {"failing": False, "ever": False}
    inbox = Inbox(messages=3, judge=lambda: reported["failing"])
    worker = _worker(store, inbox, executor, stop)
    keeping_failed, keeping_succeeded = worker.keeping.failed, worker.keeping.succeeded

    def failed(source: str, error: str) -> None:
        if source == COMPLETIONS:
            reported["failing"] = reported["ever"] = True
        keeping_failed(source, error)

    def succeeded(source: str) -> None:
        if source == COMPLETIONS:
            reported["failing"] = False
        keeping_succeeded(source)

    worker.keeping.failed = failed  # type: ignore[method-assign]
    worker.keeping.succeeded = succeeded  # type: ignore[method-assign]
    store.verdicts_record = False
    executor.finish.set()  # runs finish at once; their verdicts cannot be recorded
    task = asyncio.create_task(worker.run())
    await _until(lambda: store.record_failures >= 3, "completions to fail")
    # The judge is only as good as the report it reads: the completer made it.
    assert reported["ever"], "the completer never reported its failures"
    fetches = inbox.fetches
    store.verdicts_record = True
    await _until(lambda: len(store.recorded) == 3, "every verdict recorded")
    await _until(lambda: inbox.fetches > fetches, "fetching to resume once recorded")
    await _stopped(worker, task, executor)
    assert inbox.fetched_when_it_should_not == 0


async def test_a_silent_broker_pauses_the_intake_until_it_answers_again() -> None:
    store, executor, stop = Store(), Executor(), asyncio.Event()
    inbox = Inbox(messages=1, judge=lambda: inbox.reconnects > 0 and not inbox.broker_up)
    inbox.broker_up = False
    worker = _worker(store, inbox, executor, stop)
    task = asyncio.create_task(worker.run())
    await _until(lambda: inbox.reconnects >= 3, "the broker asked again and again")
    assert inbox.fetches == 1  # one silent fetch, then only reconnects
    inbox.broker_up = True
    await _until(lambda: executor.started == 1, "the run to be fetched once the broker is back")
    await _stopped(worker, task, executor)
    assert inbox.fetched_when_it_should_not == 0

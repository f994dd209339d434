"""Fakes shared by the unit and integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

from prometheus_client import REGISTRY

from actors.domain import (
    ExecutionResult,
    ExecutorSpec,
    Outcome,
    RetryPolicy,
    RunContext,
    StartRefusal,
)
from actors.ports import (
    Completion,
    DispatchMessage,
    NotStarted,
    RunStore,
    StartedRun,
    StoreUnavailable,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def dispatch(run_id: str = "r", epoch: int = 1, *, job: str = "job") -> DispatchMessage:
    """A dispatch message of deployment "d"."""
    return DispatchMessage(
        run_id=run_id, epoch=epoch, job=job, scheduled_at=T0, attempt=1, deployment="d"
    )


def sample(name: str, **labels: str) -> float:
    """A metric's value in this process (0 before its first increment)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class RecordingDelivery:
    """A broker delivery that records how the worker settled it.

    ``settled`` holds the verdicts (ack, term, nak) in order; heartbeats
    (``in_progress``) are counted apart, since they settle nothing.
    """

    def __init__(self, message: DispatchMessage | None = None, delivery_count: int = 1) -> None:
        self.message = message if message is not None else dispatch()
        self.delivery_count = delivery_count
        self.settled: list[str] = []
        self.progress_marks = 0

    async def ack(self) -> None:
        self.settled.append("ack")

    async def term(self) -> None:
        self.settled.append("term")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def in_progress(self) -> None:
        self.progress_marks += 1


class FixedClock:
    """The Clock port, standing still unless moved."""

    def __init__(self, now: datetime = T0) -> None:
        self.current = now

    def now(self) -> datetime:
        return self.current


class WorkerStore:
    """The worker's side of the run store, with the database's answers set by the test.

    Starts every run it is asked for, except those named in ``not_started``
    (run id -> reason). ``start_error`` / ``complete_errors`` (run id -> error,
    raised for any batch holding that run) / ``complete_outages`` (that many
    calls fail as unreachable) / ``fenced`` (run ids recorded as moved on).
    ``events`` is the order in which starts and records happened.
    """

    def __init__(self) -> None:
        self.not_started: dict[str, StartRefusal] = {}
        self.start_error: Exception | None = None
        self.complete_errors: dict[str, Exception] = {}
        self.complete_outages = 0
        self.fenced: set[str] = set()
        self.starts: list[list[DispatchMessage]] = []
        self.recorded: list[Completion] = []
        self.interrupted: list[tuple[str, int]] = []
        self.events: list[tuple[str, str]] = []
        self.extend_calls = 0

    def as_port(self) -> RunStore:
        return cast(RunStore, self)

    async def ping(self) -> None:
        return None

    async def start_runs(
        self,
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> tuple[list[StartedRun], list[NotStarted]]:
        self.starts.append(list(messages))
        if self.start_error is not None:
            raise self.start_error
        started, skipped = [], []
        for m in messages:
            if m.run_id in self.not_started:
                skipped.append(NotStarted(m.run_id, m.epoch, self.not_started[m.run_id], None))
                continue
            self.events.append(("start", m.run_id))
            started.append(
                StartedRun(
                    m.run_id,
                    m.epoch,
                    m.job,
                    m.scheduled_at,
                    m.attempt,
                    max_attempts=3,
                    executor=cast(ExecutorSpec, None),
                    timeout=timedelta(seconds=60),
                    retry=RetryPolicy(),
                )
            )
        return started, skipped

    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]:
        self.extend_calls += 1
        return set(runs)

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        if self.complete_outages > 0:
            self.complete_outages -= 1
            raise StoreUnavailable("complete: connection refused")
        for c in completions:
            if c.run_id in self.complete_errors:
                raise self.complete_errors[c.run_id]
        self.recorded += completions
        self.events += [("record", c.run_id) for c in completions]
        return {(c.run_id, c.epoch) for c in completions if c.run_id not in self.fenced}

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int:
        self.interrupted += runs
        return len(runs)


class GatedExecutor:
    """Each execution waits until the test lets it finish; ``outcome`` is what it reports."""

    def __init__(self, outcome: Outcome = Outcome.SUCCEEDED) -> None:
        self.finish = asyncio.Event()
        self.outcome = outcome
        self.calls: list[tuple[str, int]] = []
        self.cancelled: list[str] = []

    def runs_inline(self, executor: str | None) -> bool:
        return False

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        self.calls.append((context.run_id, context.fencing_token))
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.cancelled.append(context.run_id)
            raise
        return ExecutionResult(self.outcome)

"""Completing: verdicts recorded in batches, each message acked only after its run was.

Order is the guarantee. The run is recorded (complete, committed) before the
message is acked: a crash between the two means a redelivery, and the
redelivered message finds the run terminal and changes nothing. Acking first
would lose the run if the process died before recording it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from actors.domain import AttemptVerdict, RunState
from actors.observability import (
    COMPLETIONS_REJECTED,
    FENCED_COMPLETIONS,
    RUNS_COMPLETED,
    RUNS_FAILED_FINALLY,
    get_logger,
)
from actors.observability.tracing import tracing
from actors.pacing import Backoff
from actors.ports import Outage, RecordRejected, WorkerStore, settle_quietly
from actors.worker.heartbeat import COMPLETIONS, Keeping
from actors.worker.holding import Holding, Key, Pending

log = get_logger("worker")
COMPLETION_BATCH = 256
COMPLETIONS_IN_FLIGHT = 2  # batches recorded at once
# At an instant, verdicts wait this long at most for its runs' starts (see
# Starter.held_starts_first).
STARTS_FIRST_S = 1.0


class Completer:
    def __init__(
        self,
        store: WorkerStore,
        holding: Holding,
        keeping: Keeping,
        starts_first: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """``starts_first(at_most)``: returns once the starts that go before verdicts ended."""
        self.store = store
        self.holding = holding
        self.keeping = keeping
        self.starts_first = starts_first
        self._failing = 0  # batches whose last try failed in an outage

    async def run(self) -> None:
        """Record verdicts in batches, then ack each message whose run was recorded.

        ``COMPLETIONS_IN_FLIGHT`` batches are recorded at once: while one
        ``complete_runs`` waits for its reply, the next batch is on its way
        rather than waiting behind it. Their rows never overlap (a run is queued
        once), and each statement locks its rows in id order, like the
        heartbeat, so they cannot deadlock (see the worker's statements).

        Errors by kind: an outage is waited out (``_record`` retries; the lease
        has slack, and while the database is away the heartbeat cannot renew it
        either). Anything else is about some runs of the batch: the batch is
        recorded one by one, and the runs that still fail are abandoned to their
        leases. A refusal of the data (RecordRejected) is that run's alone; any
        other error is a bug, re-raised once the rest of its batch is settled,
        so that the supervisor counts it against the worker's crash budget (a
        batch being recorded beside it is dropped, as in a crash).
        """
        self._failing = 0
        tasks = [asyncio.create_task(self._record_batches()) for _ in range(COMPLETIONS_IN_FLIGHT)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if (exc := task.exception()) is not None:
                    raise exc
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        self._take_back_the_stop()

    async def _record_batches(self) -> None:
        """One of the recorders: a batch from the queue at a time, until the stop (None)."""
        queue = self.holding.completions
        done = False
        while not done:
            first = await queue.get()
            if first is None:
                queue.put_nowait(None)  # the other recorders stop too (a place just freed)
                return
            if self.starts_first is not None:
                await self.starts_first(STARTS_FIRST_S)
            batch = [first]
            while len(batch) < COMPLETION_BATCH and not queue.empty():
                item = queue.get_nowait()
                if item is None:
                    queue.put_nowait(None)
                    done = True
                    break
                batch.append(item)
            bug: Exception | None = None
            try:
                recorded = await self._record(batch)
            except Exception:  # noqa: BLE001 - not an outage: find the runs it is about
                recorded = set()
                kept = []
                for pending in batch:
                    try:
                        recorded |= await self._record([pending])
                        kept.append(pending)
                    except Exception as exc:  # noqa: BLE001 - abandoned; bugs re-raised below
                        await self._abandon(pending, exc)
                        if bug is None and not isinstance(exc, RecordRejected):
                            bug = exc
                batch = kept
            await self._settle(batch, recorded)
            if bug is not None:
                raise bug

    def _take_back_the_stop(self) -> None:
        """The stop put back for the other recorders is taken out once they all stopped."""
        queue = self.holding.completions
        left = [queue.get_nowait() for _ in range(queue.qsize())]
        for item in left:
            if item is not None:
                queue.put_nowait(item)

    async def _record(self, batch: list[Pending]) -> set[Key]:
        """complete_runs, retried while the database is unreachable; other errors raise.

        While it fails, the worker fetches nothing (``keeping``). The backoff
        stays short: once the database is back, this batch holds every later
        verdict and the worker's intake.
        """
        backoff = Backoff(initial=0.1, maximum=2.0)
        failing = False  # this batch counted among the failing ones
        try:
            while True:
                try:
                    with self.keeping.call(COMPLETIONS):
                        # Shielded: a completion that reached the database must be acted on.
                        recorded = await asyncio.shield(
                            self.store.complete_runs([p.completion for p in batch])
                        )
                except Outage as exc:
                    if not failing:
                        failing = True
                        self._failing += 1
                    self.keeping.failed(COMPLETIONS, repr(exc)[:200])
                    delay = backoff.next_delay()
                    log.warning(
                        "complete failed; retrying",
                        runs=len(batch),
                        error=repr(exc),
                        delay_s=round(delay, 3),
                    )
                    await self.keeping.rest(delay)
                    continue
                if failing:
                    failing = False
                    self._failing -= 1
                if not self._failing:  # another batch's verdicts may still wait on the database
                    self.keeping.succeeded(COMPLETIONS)
                return recorded
        finally:
            if failing:
                self._failing -= 1

    async def _abandon(self, pending: Pending, exc: Exception) -> None:
        """Give up recording one attempt; its lease lapses and the reaper recovers the run.

        The run leaves the in-flight set, so the heartbeat no longer extends its
        lease. Its message is terminated, not acked (nothing was recorded), and
        not left to be redelivered: a redelivery would change nothing anyway
        (START_RUNS does not take up again a run this worker began), and the
        run's recovery never depended on the message: the reaper returns it to
        pending and the next claim dispatches it under a new epoch.
        """
        c = pending.completion
        COMPLETIONS_REJECTED.inc()
        refused = isinstance(exc, RecordRejected)
        log.error(
            "completion rejected by the database; the lease will recover the run"
            if refused
            else "completion could not be recorded (unexpected error); "
            "the lease will recover the run",
            run_id=c.run_id,
            job=pending.job,
            epoch=c.epoch,
            error=repr(exc)[:500],
        )
        entry = self.holding.in_flight.get((c.run_id, c.epoch))
        if entry is not None:
            self.holding.forget(entry)  # stop heartbeating it, so its lease can expire
        tracing().end(pending.span, f"completion not recorded: {exc!r}")
        await settle_quietly(pending.delivery.term())

    async def _settle(self, batch: list[Pending], recorded: set[Key]) -> None:
        for pending in batch:
            c = pending.completion
            key = (c.run_id, c.epoch)
            if key in recorded:
                RUNS_COMPLETED.labels(pending.job, c.result.outcome.value).inc()
                verdict = c.verdict or AttemptVerdict.final(c.result.outcome)
                if verdict.state is RunState.FAILED:
                    RUNS_FAILED_FINALLY.labels(pending.job).inc()
            else:
                # The epoch moved on (reaped, cancelled): this execution was a duplicate.
                FENCED_COMPLETIONS.inc()
                log.warning(
                    "completion fenced: the run moved on",
                    run_id=c.run_id,
                    job=pending.job,
                    epoch=c.epoch,
                )
            if pending.span is not None:
                tracing().end(
                    pending.span,
                    None if key in recorded else "completion fenced: the run moved on",
                    **{"claimd.recorded": key in recorded},
                )
            await settle_quietly(pending.delivery.ack())
            entry = self.holding.in_flight.get(key)
            if entry is not None:
                self.holding.forget(entry)

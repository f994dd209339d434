"""Executing: one attempt, its verdict decided (actors.domain.decide_attempt) and queued."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from logging import INFO
from typing import Any

from actors.domain import ExecutionResult, Outcome, RunContext, RunState, decide_attempt
from actors.observability import RUN_DURATION, RUNS_STARTED, SCHEDULE_LAG, get_logger, logs_at
from actors.observability.secrets import MASKER
from actors.observability.tracing import Span, Tracing, run_attributes, tracing
from actors.ports import Clock, Completion, Executor, StartedRun, settle_quietly
from actors.worker.heartbeat import InFlight
from actors.worker.holding import Holding, Pending

log = get_logger("worker")


class Execution:
    def __init__(
        self, executor: Executor, worker_id: str, holding: Holding, clock: Clock | None
    ) -> None:
        self.executor = executor
        self.worker_id = worker_id
        self.holding = holding
        # Lag is measured on the database's clock (estimated locally), not the host's.
        self.clock = clock

    async def __call__(self, run: StartedRun, entry: InFlight) -> None:
        """Execute ``run``; queue its verdict for the completer (which acks after recording).

        The run's start is counted and logged just after its execution is under way
        (the next turn of the loop): the runs of an instant are started together,
        and each one's bookkeeping would otherwise stand before the next one's code.
        """
        ids = {"run_id": run.run_id, "job": run.job, "attempt": run.attempt, "epoch": run.epoch}
        asyncio.get_running_loop().call_soon(self._began, run, ids)
        tracer = tracing()
        context = run.context()
        span = execute_span = None
        if tracer.enabled:
            span, execute_span, context = _traced(tracer, run, context)
        try:
            result = await self.executor.execute(run.executor, context, run.timeout)
        except asyncio.CancelledError:
            tracer.end(execute_span, "cancelled")
            tracer.end(span, "cancelled: lease lost" if entry.lease_lost else "cancelled")
            if entry.lease_lost:
                # Another attempt may own the run now; record nothing, settle the message.
                self.holding.forget(entry)
                await settle_quietly(entry.message.ack())
                return
            self.holding.forget(entry)
            raise
        except Exception as exc:  # an executor bug fails the run, not the worker
            log.error("executor raised", **ids, error=repr(exc), exc_info=True)
            # Cut first, then masked: a secret cut by the cut is masked too.
            error = MASKER.mask_tail(f"executor error: {exc!r}"[:1000])
            result = ExecutionResult(Outcome.FAILED, error=error)
        verdict = decide_attempt(
            result.outcome,
            state=RunState.RUNNING,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            policy=run.retry,
            run_id=run.run_id,
        )
        if execute_span is not None:
            failed = result.outcome is not Outcome.SUCCEEDED
            tracer.end(
                execute_span,
                (result.error or result.outcome.value) if failed else None,
                **{"claimd.outcome": result.outcome.value},
            )
        RUN_DURATION.labels(run.job).observe(result.duration.total_seconds())
        fields: dict[str, Any] = {
            "outcome": result.outcome.value,
            "exit_code": result.exit_code,
            "duration_s": round(result.duration.total_seconds(), 3),
        }
        if result.outcome is Outcome.SUCCEEDED:
            if logs_at(INFO):
                log.info("run finished", **ids, **fields)
        elif verdict.retry:
            log.warning(
                "run attempt failed; will retry",
                **ids,
                **fields,
                error=result.error,
                retry_in_s=None if verdict.due_in is None else verdict.due_in.total_seconds(),
                max_attempts=run.max_attempts,
            )
        else:
            # The last attempt: the run fails for good. What failed is in the line.
            log.error(
                "run failed; no attempts left",
                **ids,
                **fields,
                error=result.error,
                max_attempts=run.max_attempts,
            )
        completion = Completion(run.run_id, run.epoch, result, verdict, self.worker_id)
        await self.holding.completions.put(Pending(completion, entry.message, run.job, span))

    def _began(self, run: StartedRun, ids: dict[str, Any]) -> None:
        """The run's start, counted, its lag observed, and logged."""
        RUNS_STARTED.labels(run.job).inc()
        if run.trigger == "schedule":
            # Triggered and backfilled runs are due when asked for, often long
            # ago: they would fill the top bucket and swamp the sum.
            now = self.clock.now() if self.clock is not None else datetime.now(UTC)
            lag = (now - (run.due_at or run.scheduled_at)).total_seconds()
            SCHEDULE_LAG.labels(run.job).observe(max(0.0, lag))
        if logs_at(INFO):  # no logger bound per run when the line is dropped anyway
            log.info("run started", **ids)


def _traced(tracer: Tracing, run: StartedRun, context: RunContext) -> tuple[Span, Span, RunContext]:
    """The run's span (child of the dispatch's), its execution's, and the job's context."""
    attributes = run_attributes(run.run_id, run.job, run.scheduled_at, run.epoch, run.attempt)
    span = tracer.start("claimd.run", attributes, parent=dict(run.trace_context))
    execute_span = tracer.start("claimd.execute", attributes, parent_span=span)
    trace = tuple(tracer.context_of(execute_span).items())
    return span, execute_span, replace(context, trace_context=trace)

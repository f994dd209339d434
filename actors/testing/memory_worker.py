"""The worker's statements in memory: start, heartbeat, complete, interrupt."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta

from actors.domain import (
    AttemptVerdict,
    ExecutionResult,
    Outcome,
    RunState,
    StartRefusal,
    decide_attempt,
    refusal_of,
)
from actors.domain.row_rules import completion_accepted, due_to_start, held_running, startable
from actors.ports import Completion, DispatchMessage, NotStarted, StartedRun
from actors.testing.memory_claims import InMemoryClaims
from actors.testing.memory_rows import AttemptRow, JobRow, RunRow


class InMemoryWorkerStatements(InMemoryClaims):
    """The worker's side of the store (WorkerStore) on the in-memory rows."""

    async def start_runs(
        self,
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> tuple[list[StartedRun], list[NotStarted]]:
        """START_RUNS, then RUN_STATES for the messages that started nothing."""
        now = self._now()
        skips = {
            m.run_id: self._must_not_run(self.runs[m.run_id], now)
            for m in messages
            if m.run_id in self.runs and self.runs[m.run_id].state is RunState.CLAIMED
        }
        started: list[StartedRun] = []
        refused: list[NotStarted] = []
        for m in messages:
            run = self.runs.get(m.run_id)
            if run is None:
                refused.append(NotStarted(m.run_id, m.epoch, StartRefusal.UNKNOWN, None))
                continue
            if not startable(run, worker, m.epoch, (m.run_id, m.epoch) in retake):
                why = refusal_of(run.state, run.epoch, m.epoch)
                refused.append(NotStarted(m.run_id, m.epoch, why, run.state))
                continue
            if run.state is RunState.CLAIMED and self._job_of(run).paused:
                # START_RUNS hands a claimed run of a paused job back to pending.
                run.hand_back()
                refused.append(NotStarted(m.run_id, m.epoch, StartRefusal.STALE, RunState.PENDING))
                continue
            if not due_to_start(run, now):
                # START_RUNS starts no claimed run before it is due.
                refused.append(NotStarted(m.run_id, m.epoch, StartRefusal.EARLY, run.state))
                continue
            skip = skips.get(m.run_id)
            if skip is not None:
                run.finish(RunState.SKIPPED, now, skip)
                refused.append(
                    NotStarted(run.id, run.epoch, StartRefusal.SKIPPED, RunState.SKIPPED)
                )
                continue
            if run.state is RunState.CLAIMED:
                run.started_at = now
            run.state = RunState.RUNNING
            run.lease_owner = worker
            run.lease_expires_at = now + lease
            job = self._job_of(run)
            try:
                spec = self._decoded.job(job.name, job.fingerprint, job.definition)
            except (KeyError, ValueError, TypeError) as exc:
                await self._fail_unreadable(run, job, worker, exc)
                refused.append(
                    NotStarted(run.id, run.epoch, StartRefusal.UNREADABLE, RunState.RUNNING)
                )
                continue
            started.append(
                StartedRun(
                    run_id=run.id,
                    epoch=run.epoch,
                    job=run.job,
                    scheduled_at=run.scheduled_at,
                    attempt=run.attempt,
                    max_attempts=job.max_attempts,
                    executor=spec.executor,
                    timeout=spec.timeout,
                    retry=spec.retry,
                    trigger=run.trigger,
                    due_at=run.due_at,
                )
            )
        return started, refused

    async def _fail_unreadable(self, run: RunRow, job: JobRow, worker: str, exc: Exception) -> None:
        verdict = decide_attempt(
            Outcome.FAILED,
            state=RunState.RUNNING,
            attempt=run.attempt,
            max_attempts=job.max_attempts,
            policy=None,
            run_id=run.id,
        )
        error = f"stored job definition unreadable by this worker: {exc!r}"[:1000]
        await self.complete_runs(
            [
                Completion(
                    run.id, run.epoch, ExecutionResult(Outcome.FAILED, error=error), verdict, worker
                )
            ]
        )

    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]:
        """EXTEND_LEASES: this worker's running rows under their epoch."""
        now = self._now()
        extended = set()
        for run_id, epoch in runs:
            run = self.runs.get(run_id)
            if run is not None and held_running(run, worker, epoch):
                run.lease_expires_at = now + lease
                extended.add((run_id, epoch))
        return extended

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        """COMPLETE_RUNS: each verdict applied where the epoch still holds and the run runs."""
        now = self._now()
        recorded = set()
        for c in completions:
            run = self.runs.get(c.run_id)
            if run is None or not completion_accepted(run, c.epoch):
                continue  # fenced: the run moved on
            verdict = c.verdict or AttemptVerdict.final(c.result.outcome)
            self._attempt(
                run,
                c.worker,
                c.result.outcome,
                c.result.error,
                c.result.exit_code,
                c.result.output_tail,
            )
            run.apply(verdict, now)
            run.outcome = c.result.outcome.value
            run.exit_code = c.result.exit_code
            run.error = c.result.error
            run.output_tail = c.result.output_tail
            recorded.add((c.run_id, c.epoch))
        return recorded

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int:
        """INTERRUPT_RUNS: this worker's unfinished runs back to pending, attempt kept."""
        now = self._now()
        handed_back = 0
        for run_id, epoch in runs:
            run = self.runs.get(run_id)
            if run is None or not held_running(run, worker, epoch):
                continue
            verdict = decide_attempt(
                Outcome.INTERRUPTED,
                state=run.state,
                attempt=run.attempt,
                max_attempts=self._job_of(run).max_attempts,
                policy=None,
                run_id=run.id,
            )
            self._attempt(
                run, worker, Outcome.INTERRUPTED, "the worker stopped before the run finished"
            )
            run.apply(verdict, now)
            handed_back += 1
        return handed_back

    def _attempt(
        self,
        run: RunRow,
        worker: str,
        outcome: Outcome,
        error: str | None,
        exit_code: int | None = None,
        output_tail: str | None = None,
    ) -> None:
        """One row of job_run_attempts: the attempt as it ran, before its verdict moves it."""
        self.attempts.append(
            AttemptRow(
                run.id,
                run.attempt,
                run.epoch,
                worker,
                run.started_at,
                outcome,
                error,
                exit_code,
                finished_at=self.clock.now(),
                output_tail=output_tail,
            )
        )

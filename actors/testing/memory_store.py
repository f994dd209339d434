"""The RunStore port in memory: the SQL's semantics, for fast unit tests of the actors.

Each method mirrors one statement of actors.adapters.postgres (named in its
docstring) on plain Python rows, under the same guards: the claim epoch fences
every change after a claim, a lease is judged on the store's clock (the
injected ``clock``: the database's now() of the real thing), ``(job,
scheduled_at)`` is one row forever, and the attempt verdicts come from
actors.domain.decide_attempt. One event loop, no awaits inside a method: each
call is atomic, as each statement is. It proves an actor's logic, never the
distributed behaviour (the integration tests and the fault harness do that).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from actors.domain import (
    AttemptVerdict,
    Catchup,
    ClaimedRun,
    ExecutionResult,
    Outcome,
    Overlap,
    RunState,
    decide_attempt,
)
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import Completion, DispatchMessage, NotStarted, StartedRun
from actors.testing.memory_catalog import ACTIVE, InMemoryJobCatalog
from actors.testing.memory_rows import (
    DEADLINE_MISSED,
    OVERLAP_FORBIDDEN,
    SUPERSEDED,
    AttemptRow,
    JobRow,
    RunRow,
)


class InMemoryRunStore(InMemoryJobCatalog):
    """RunStore on the in-memory rows: claims, starts, heartbeats, completions, the reaper."""

    # -- claims --------------------------------------------------------------------------

    async def skip_unrunnable(self, limit: int) -> list[tuple[str, str]]:
        """SKIP_UNRUNNABLE: overlap and latest nominate up to ``limit`` runs per job, the
        start deadline the ``limit`` oldest late first attempts of all jobs."""
        now = self._now()
        nominated: dict[str, str | None] = {}
        late: list[RunRow] = []
        for job in self.jobs.values():
            if not job.enabled or job.paused:
                continue
            pending = sorted(
                (
                    r
                    for r in self.runs.values()
                    if r.job == job.name and r.state is RunState.PENDING
                ),
                key=lambda r: r.scheduled_at,
            )
            if job.overlap is Overlap.FORBID and self._active(job.name):
                due = [r for r in pending if r.scheduled_at <= now and r.due_at <= now]
                for r in due[:limit]:
                    nominated[r.id] = OVERLAP_FORBIDDEN
            if job.start_deadline is not None:
                late += [
                    r
                    for r in pending
                    if r.trigger == "schedule"
                    and r.attempt == 1
                    and r.scheduled_at < now - job.start_deadline
                ]
            if job.catchup is Catchup.LATEST:
                behind = [r for r in pending if r.trigger == "schedule" and r.due_at <= now]
                for r in behind[:limit]:
                    nominated.setdefault(r.id, None)
        for r in sorted(late, key=lambda r: r.scheduled_at)[:limit]:
            nominated.setdefault(r.id, None)
        skipped = []
        verdicts = {
            run_id: self._must_not_run(self.runs[run_id], now) or reason
            for run_id, reason in sorted(nominated.items())[:limit]
        }
        for run_id, reason in verdicts.items():
            if reason is not None:
                self.runs[run_id].finish(RunState.SKIPPED, now, reason)
                skipped.append((run_id, reason))
        return skipped

    async def claim_due_runs(
        self,
        owner: str,
        limit: int,
        lease: timedelta,
        max_claimed: int,
        ahead: timedelta = timedelta(0),
    ) -> list[ClaimedRun]:
        """COUNT_CLAIMED, then CLAIM_DUE_RUNS and CLAIM_EXCLUSIVE_RUNS (due by now + ahead)."""
        now = self._now()
        by = now + ahead
        room = min(limit, max(0, max_claimed - len(self.in_state(RunState.CLAIMED))))
        open_jobs = {n for n, j in self.jobs.items() if j.enabled and not j.paused}
        due = sorted(
            (
                r
                for r in self.runs.values()
                if r.state is RunState.PENDING
                and r.due_at <= by
                and r.job in open_jobs
                and self.jobs[r.job].overlap is Overlap.ALLOW
            ),
            key=lambda r: r.due_at,
        )[:room]
        claimed = self._claim_or_skip(due, owner, lease, now, exclusive=False)
        candidates = []
        for name in sorted(open_jobs):
            if self.jobs[name].overlap is Overlap.ALLOW or self._active(name):
                continue
            pending = [
                r
                for r in self.runs.values()
                if r.job == name and r.state is RunState.PENDING and r.due_at <= by
            ]
            if pending:
                candidates.append(min(pending, key=lambda r: r.scheduled_at))
        candidates = sorted(candidates, key=lambda r: r.due_at)[:limit]
        return claimed + self._claim_or_skip(candidates, owner, lease, now, exclusive=True)

    def _claim_or_skip(
        self, batch: list[RunRow], owner: str, lease: timedelta, now: datetime, *, exclusive: bool
    ) -> list[ClaimedRun]:
        """_CLAIM_OR_SKIP: verdicts on the batch as locked, then one update of each row."""
        verdicts = [(run, self._must_not_run(run, now)) for run in batch]
        claimed = []
        for run, skip in verdicts:
            if skip is not None:
                run.finish(RunState.SKIPPED, now, skip)  # keeps its epoch: never claimed
                continue
            run.state = RunState.CLAIMED
            run.exclusive = exclusive
            run.lease_owner = owner
            run.lease_expires_at = now + lease
            run.epoch += 1
            run.claimed_at = now
            claimed.append(
                ClaimedRun(
                    run.id,
                    run.job,
                    run.scheduled_at,
                    run.attempt,
                    run.epoch,
                    run.due_at,
                    executor_hint(self.jobs[run.job].definition),
                )
            )
        return claimed

    async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int:
        """RELEASE_UNPUBLISHED: only this owner's claims under that epoch, still only claimed."""
        self._now()
        released = 0
        for claimed in runs:
            run = self.runs.get(claimed.run_id)
            if run is None or not run.held(owner, claimed.epoch, RunState.CLAIMED):
                continue
            run.state = RunState.PENDING
            run.lease_owner = run.lease_expires_at = run.claimed_at = None
            released += 1
        return released

    async def cancel_orphaned_runs(self) -> int:
        """CANCEL_ORPHANED_RUNS: pending runs of jobs gone from the config."""
        now = self._now()
        orphaned = [
            r
            for r in self.runs.values()
            if r.state is RunState.PENDING and not self._job_of(r).enabled
        ]
        for run in orphaned:
            run.finish(RunState.CANCELLED, now, REMOVED_FROM_CONFIG)
        return len(orphaned)

    async def prune_history(self, older_than: timedelta, batch: int) -> int:
        """PRUNE_HISTORY: up to ``batch`` terminal runs finished before now - older_than; the
        job's history_pruned_through moves to the latest instant deleted."""
        now = self._now()
        old = [
            r.id
            for r in self.runs.values()
            if r.state.terminal and r.finished_at is not None and r.finished_at < now - older_than
        ][:batch]
        for run_id in old:
            run = self.runs.pop(run_id)
            job = self.jobs[run.job]
            if job.history_pruned_through is None or run.scheduled_at > job.history_pruned_through:
                job.history_pruned_through = run.scheduled_at
        return len(old)

    # -- the worker's statements -------------------------------------------------------

    async def next_due_in(self, ahead: timedelta) -> timedelta | None:
        """NEXT_DUE_IN: the soonest pending run of an open job due after now + ahead."""
        now = self._now()
        open_jobs = {n for n, j in self.jobs.items() if j.enabled and not j.paused}
        soonest = min(
            (
                r.due_at
                for r in self.runs.values()
                if r.state is RunState.PENDING and r.job in open_jobs and r.due_at > now + ahead
            ),
            default=None,
        )
        return None if soonest is None else soonest - now

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
                refused.append(NotStarted(m.run_id, m.epoch, "unknown", None))
                continue
            retaken = run.held(worker, m.epoch, RunState.RUNNING) and (m.run_id, m.epoch) in retake
            if run.epoch != m.epoch or not (run.state is RunState.CLAIMED or retaken):
                refused.append(NotStarted(m.run_id, m.epoch, _why_not(run, m.epoch), run.state))
                continue
            if run.state is RunState.CLAIMED and self._job_of(run).paused:
                # START_RUNS hands a claimed run of a paused job back to pending.
                run.state = RunState.PENDING
                run.lease_owner = run.lease_expires_at = run.claimed_at = None
                refused.append(NotStarted(m.run_id, m.epoch, "stale", RunState.PENDING))
                continue
            if run.state is RunState.CLAIMED and run.due_at > now:
                # START_RUNS starts no claimed run before it is due.
                refused.append(NotStarted(m.run_id, m.epoch, "early", run.state))
                continue
            skip = skips.get(m.run_id)
            if skip is not None:
                run.finish(RunState.SKIPPED, now, skip)
                refused.append(NotStarted(run.id, run.epoch, "skipped", RunState.SKIPPED))
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
                refused.append(NotStarted(run.id, run.epoch, "unreadable", RunState.RUNNING))
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
            if run is not None and run.held(worker, epoch, RunState.RUNNING):
                run.lease_expires_at = now + lease
                extended.add((run_id, epoch))
        return extended

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        """COMPLETE_RUNS: each verdict applied where the epoch still holds and the run runs."""
        now = self._now()
        recorded = set()
        for c in completions:
            run = self.runs.get(c.run_id)
            if run is None or run.epoch != c.epoch or run.state is not RunState.RUNNING:
                continue  # fenced: the run moved on
            verdict = c.verdict or AttemptVerdict.final(c.result.outcome)
            self._attempt(run, c.worker, c.result.outcome, c.result.error, c.result.exit_code)
            self._apply(run, verdict, now)
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
            if run is None or not run.held(worker, epoch, RunState.RUNNING):
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
            self._apply(run, verdict, now)
            handed_back += 1
        return handed_back

    # -- the reaper --------------------------------------------------------------------

    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]:
        """LOCK_EXPIRED_LEASES, each verdict from decide_attempt, APPLY_REAPED."""
        now = self._now()
        expired = sorted(
            (
                r
                for r in self.runs.values()
                if r.state in ACTIVE and r.lease_expires_at is not None and r.lease_expires_at < now
            ),
            key=lambda r: r.lease_expires_at or now,
        )[:limit]
        reaped = []
        for run in expired:
            before = run.state
            verdict = decide_attempt(
                Outcome.LEASE_EXPIRED,
                state=before,
                attempt=run.attempt,
                max_attempts=self._job_of(run).max_attempts,
                policy=None,
                run_id=run.id,
            )
            if before is RunState.RUNNING:
                error = f"lease expired on {run.lease_owner}"
                self._attempt(run, run.lease_owner or "", Outcome.LEASE_EXPIRED, error)
                run.outcome, run.error = Outcome.LEASE_EXPIRED.value, error
            self._apply(run, verdict, now)
            reaped.append((run.id, run.job, f"{before}->{verdict.state}"))
        return reaped

    # -- applying a verdict ------------------------------------------------------------

    def _attempt(
        self,
        run: RunRow,
        worker: str,
        outcome: Outcome,
        error: str | None,
        exit_code: int | None = None,
    ) -> None:
        self.attempts.append(
            AttemptRow(
                run.id, run.attempt, run.epoch, worker, run.started_at, outcome, error, exit_code
            )
        )

    def _apply(self, run: RunRow, verdict: AttemptVerdict, now: datetime) -> None:
        """Where the verdict sends the run: next state, attempt and due time; the lease ends."""
        run.state = verdict.state
        if verdict.attempt is not None:
            run.attempt = verdict.attempt
        if verdict.due_in is not None:
            run.due_at = now + verdict.due_in
        run.finished_at = None if verdict.retry else now
        if verdict.retry:
            run.started_at = None
        run.lease_owner = run.lease_expires_at = run.claimed_at = None


def _why_not(run: RunRow, epoch: int) -> str:
    """RUN_STATES read back: why a message started nothing."""
    if run.state.terminal:
        return "terminal"
    if run.epoch != epoch:
        return "stale"
    return "owned" if run.state is RunState.RUNNING else "stale"


__all__ = ["DEADLINE_MISSED", "SUPERSEDED", "InMemoryRunStore"]


def executor_hint(definition: str) -> str | None:
    """EXECUTOR_HINT: "python:<target>", "shell" or "http", from a stored definition."""
    executor = json.loads(definition).get("executor", {})
    kind = executor.get("kind")
    if kind == "python":
        return f"python:{executor.get('target')}"
    return str(kind) if kind is not None else None

"""The operator's port in memory: the history's reads (actors.testing.memory_history) and
the recorded actions, on the rows of an InMemoryRunStore, so that the HTTP API and the
operator's commands run in a unit test.

Each action mirrors the statements of actors.adapters.postgres.statements.operator
(named in its docstring), on the store's clock. Held to the same contract tests
as the PostgreSQL adapter (tests/contract/test_operator.py): where the two
disagree, PostgreSQL is right and this one is fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from actors.domain import Overlap, RunState, decode_job, format_duration
from actors.domain.backfill import BackfillProgress, plan_backfill
from actors.domain.pause import PausedInstants, instants_between, paused_gaps, skipped_reason
from actors.ports import (
    Action,
    ActiveRun,
    Caller,
    Cancelled,
    Recorded,
    Resumed,
    Unchanged,
    UnknownJob,
)
from actors.testing.memory_history import InMemoryHistory
from actors.testing.memory_rows import JobRow

CANCELLABLE = (RunState.PENDING, RunState.CLAIMED, RunState.RUNNING)


class InMemoryOperatorStore(InMemoryHistory):
    """The OperatorStore port on an InMemoryRunStore's rows (its jobs, runs, attempts,
    gaps, rejected jobs and action log)."""

    async def record_action(self, actor: Caller, action: Action) -> Recorded:
        """RECORD_ACTION."""
        row = self.store.record(actor.name, actor.via, actor.origin, action)
        return Recorded(row["id"], row["at"])

    async def pause(self, actor: Caller, job: str, *, result: str) -> Recorded | Unchanged:
        """LOCK_JOB, SET_PAUSED (a pause hands back the claims), RECORD_ACTION."""
        self.store._now()
        if isinstance(unchanged := self._to_flip(job, paused=True), Unchanged):
            return unchanged
        await self.store.set_paused(job, True)
        return await self.record_action(actor, Action("pause", True, result, job=job))

    async def resume(
        self,
        actor: Caller,
        job: str,
        paused_instants: PausedInstants,
        *,
        arguments: dict[str, Any],
        result: Callable[[Resumed], str],
    ) -> tuple[Resumed, Recorded] | Unchanged:
        """LOCK_JOB, PAUSED_JOB; with SKIP: SKIP_PAUSED_RUNS, RECORD_GAPS, MOVE_MARK_TO_NOW;
        then SET_PAUSED and RECORD_ACTION."""
        now = self.store._now()
        row = self._to_flip(job, paused=False)
        if isinstance(row, Unchanged):
            return row
        decoded = decode_job(job, row.definition)
        policy = (
            f'catchup = "{decoded.catchup.value}", '
            f'catchup_window = "{format_duration(decoded.catchup_window)}"'
        )
        since = next(
            (
                a["at"]
                for a in reversed(self.store.actions)
                if a["job"] == job and a["action"] == "pause" and a["ok"]
            ),
            None,
        )
        runs = [r for r in self.store.runs.values() if r.job == job]
        due_now = sum(r.state is RunState.PENDING and r.due_at <= now for r in runs)
        # Where the materializer would plan from: its mark, or (never planned) the job's start.
        mark = row.materialized_until or min(row.created_at or now, now)
        unwritten = instants_between(decoded.schedule, mark, now)
        done = Resumed(policy, since, now, due_now, unwritten.count if unwritten else 0)
        if paused_instants is PausedInstants.SKIP:
            reason = skipped_reason(since, now, actor.name)
            earliest = since or datetime.min.replace(tzinfo=UTC)
            skipped = [
                r
                for r in runs
                if r.state is RunState.PENDING
                and r.trigger == "schedule"
                and earliest <= r.scheduled_at <= now
            ]
            for run in skipped:
                run.finish(RunState.SKIPPED, now, reason)
            gaps = paused_gaps(decoded.schedule, mark, since, now, actor.name)
            for gap in gaps:
                if not any(
                    name == job and old.first <= gap.last and old.last >= gap.first
                    for name, old in self.store.gaps
                ):
                    self.store.gaps.append((job, gap))
            row.materialized_until = max(row.materialized_until or now, now)
            done = replace(done, runs_skipped=len(skipped), gaps=tuple(gaps))
        await self.store.set_paused(job, False)
        recorded = await self.record_action(
            actor, Action("resume", True, result(done), job=job, arguments=arguments)
        )
        return done, recorded

    def _to_flip(self, job: str, *, paused: bool) -> JobRow | Unchanged:
        """LOCK_JOB: the enabled job whose pause flag is not ``paused`` yet, or why
        nothing changes."""
        row = self.store.jobs.get(job)
        if row is None or not row.enabled:
            return Unchanged.UNKNOWN_JOB
        return Unchanged.ALREADY if row.paused == paused else row

    def _enabled(self, job: str) -> JobRow:
        row = self.store.jobs.get(job)
        if row is None or not row.enabled:
            raise UnknownJob(f"no enabled job named {job!r}")
        return row

    def _insert_at(
        self,
        job: str,
        instants: Sequence[datetime],
        trigger: str,
        overlap: Overlap | None = None,
    ) -> list[str]:
        """INSERT_RUNS_AT: one row per (job, instant), due now; the ids of the new ones."""
        now = self.store._now()
        taken = {r.scheduled_at for r in self.store.runs.values() if r.job == job}
        added = []
        for at in instants:
            if at not in taken:
                taken.add(at)
                run = self.store.add_run(job, at, due_at=now, trigger=trigger, overlap=overlap)
                added.append(run.id)
        return added

    async def trigger(
        self,
        actor: Caller,
        job: str,
        at: datetime,
        *,
        arguments: dict[str, Any],
        result: Callable[[str], str],
        overlap: Overlap | None = None,
    ) -> tuple[str, Recorded] | None:
        """JOB_BY_NAME, INSERT_RUNS_AT (trigger 'manual'), RECORD_ACTION."""
        self.store._now()
        self._enabled(job)
        added = self._insert_at(job, [at], "manual", overlap)
        if not added:
            return None
        done = Action("trigger", True, result(added[0]), job, added[0], arguments)
        recorded = await self.record_action(actor, done)
        return added[0], recorded

    async def backfill(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_runs: int,
        progress: Callable[[BackfillProgress], None] | None = None,
        overlap: Overlap | None = None,
    ) -> BackfillProgress:
        """JOB_BY_NAME, then INSERT_RUNS_AT (trigger 'backfill') a chunk at a time."""
        self.store._now()
        row = self._enabled(job)
        plan = plan_backfill(job, decode_job(job, row.definition).schedule, start, end, max_runs)
        done = plan.nothing_done()
        for batch in plan.chunks():
            done = done.after_chunk(batch, len(self._insert_at(job, batch, "backfill", overlap)))
            if progress is not None:
                progress(done)
        return done

    async def active_run(self, job: str) -> ActiveRun | None:
        """ACTIVE_RUN: the job's claimed or running run of the earliest instant."""
        self.store._now()
        active = [
            r
            for r in self.store.runs.values()
            if r.job == job and r.state in (RunState.CLAIMED, RunState.RUNNING)
        ]
        if not active:
            return None
        first = min(active, key=lambda r: r.scheduled_at)
        return ActiveRun(first.id, first.state.value)

    async def cancel(self, actor: Caller, run_id: str, *, reason: str, result: str) -> Cancelled:
        """CANCEL_RUN (the lease taken away), RUN_JOB, RECORD_ACTION; else RUN_STATE."""
        now = self.store._now()
        run = self.store.runs.get(run_id)
        if run is None:
            return Cancelled(None)
        if run.state not in CANCELLABLE:
            return Cancelled(None, state=run.state.value)
        run.finish(RunState.CANCELLED, now, reason)
        recorded = await self.record_action(
            actor, Action("cancel", True, result, job=run.job, run_id=run_id)
        )
        return Cancelled(recorded, job=run.job)

    async def close(self) -> None:
        return None


__all__ = ["InMemoryOperatorStore"]

"""The claimer's and the compensator's statements in memory: skip, claim, wake, release."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from actors.domain import Catchup, ClaimedRun, RunState, SkipReason, row_rules
from actors.domain.row_rules import claimable, job_open, runs_beside_others
from actors.ports.translator import reads_only
from actors.testing.memory_catalog import InMemoryJobCatalog
from actors.testing.memory_rows import RunRow


class InMemoryClaims(InMemoryJobCatalog):
    """The claiming side of the store (ClaimingStore) on the in-memory rows."""

    async def skip_unrunnable(self, limit: int) -> list[tuple[str, SkipReason]]:
        """SKIP_UNRUNNABLE: overlap and latest nominate up to ``limit`` runs per job, the
        start deadline the ``limit`` oldest late first attempts of all jobs."""
        now = self._now()
        nominated: dict[str, SkipReason | None] = {}
        late: list[RunRow] = []
        for job in self.jobs.values():
            if not job_open(job):
                continue
            pending = sorted(
                (r for r in self._runs_of(job.name) if r.state is RunState.PENDING),
                key=lambda r: r.scheduled_at,
            )
            busy = self._busy(job.name)
            forbidden = [r for r in pending if row_rules.overlap_forbidden(r, job, busy, now)]
            for r in forbidden[:limit]:
                nominated[r.id] = SkipReason.OVERLAP_FORBIDDEN
            late += [r for r in pending if row_rules.deadline_missed(r, job, now)]
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
        for run_id, why in verdicts.items():
            if why is not None:
                self.runs[run_id].finish(RunState.SKIPPED, now, why)
                skipped.append((run_id, why))
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
        open_jobs = {n for n, j in self.jobs.items() if job_open(j)}
        due = sorted(
            (
                r
                for r in self.runs.values()
                if claimable(r, by)
                and r.job in open_jobs
                and runs_beside_others(self.jobs[r.job], r)
            ),
            key=lambda r: r.due_at,
        )[:room]
        claimed = self._claim_or_skip(due, owner, lease, now, exclusive=False)
        candidates = []
        for name in sorted(open_jobs):
            job = self.jobs[name]
            if row_rules.job_busy(self._runs_of(name)):
                continue
            pending = [
                r
                for r in self._runs_of(name)
                if claimable(r, by) and not runs_beside_others(job, r)
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

    @reads_only
    async def next_due_in(self, ahead: timedelta) -> timedelta | None:
        """NEXT_DUE_IN: the soonest pending run of an open job due after now + ahead."""
        now = self._now()
        open_jobs = {n for n, j in self.jobs.items() if job_open(j)}
        soonest = min(
            (
                r.due_at
                for r in self.runs.values()
                if r.state is RunState.PENDING and r.job in open_jobs and r.due_at > now + ahead
            ),
            default=None,
        )
        return None if soonest is None else soonest - now

    async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int:
        """RELEASE_UNPUBLISHED: only this owner's claims under that epoch, still only claimed."""
        self._now()
        released = 0
        for claimed in runs:
            run = self.runs.get(claimed.run_id)
            if run is None or not row_rules.held_claimed(run, owner, claimed.epoch):
                continue
            run.hand_back()
            released += 1
        return released


def executor_hint(definition: str) -> str | None:
    """EXECUTOR_HINT: "python:<target>", "shell" or "http", from a stored definition."""
    executor = json.loads(definition).get("executor", {})
    kind = executor.get("kind")
    if kind == "python":
        return f"python:{executor.get('target')}"
    return str(kind) if kind is not None else None

"""The operator's reads in memory: the history (jobs, runs, attempts, gaps, rejected jobs,
the action log) on the rows of an InMemoryRunStore, as actors.adapters.postgres.history
reads them.

Each method mirrors one statement of actors.adapters.postgres.statements.history
(named in its docstring), on the store's clock. The actions beside them are
actors.testing.memory_operator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, cast

from actors.domain import RunState
from actors.domain.defaults import OVERDUE_AFTER
from actors.domain.history import Gap, RunRecord
from actors.domain.pause import pause_spans
from actors.ports import (
    ActionRecord,
    AttemptRecord,
    JobOverview,
    JobRecord,
    PausedSpan,
    Records,
    RejectedRecord,
    RunDetail,
    RunFilter,
    RunListing,
)
from actors.ports.messages import ConfigRollout
from actors.testing.memory_rows import JobRow, RunRow
from actors.testing.memory_store import InMemoryRunStore

TERMINAL = (RunState.SUCCEEDED, RunState.FAILED, RunState.SKIPPED, RunState.CANCELLED)


def _job_fields(job: JobRow) -> dict[str, Any]:
    """The job's own columns that JOBS_OVERVIEW and JOB_RECORD both answer."""
    return {
        "id": job.id,
        "name": job.name,
        "definition": job.definition,
        "enabled": job.enabled,
        "paused": job.paused,
        "history_pruned_through": job.history_pruned_through,
        "due_since": job.planned_since or job.created_at,
        "timezone": _zone(job),
    }


def _zone(job: JobRow) -> str:
    return str(json.loads(job.definition)["schedule"].get("timezone") or "UTC")


# A RunRow field whose column is named otherwise in job_runs.
_COLUMN = {"epoch": "claim_epoch"}


def _value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _newest(runs: Sequence[RunRow]) -> RunRow | None:
    return max(runs, key=lambda r: r.scheduled_at, default=None)


class InMemoryHistory:
    """The HistoryReader port on an InMemoryRunStore's rows."""

    def __init__(self, store: InMemoryRunStore) -> None:
        self.store = store

    async def now(self) -> datetime:
        """DB_NOW."""
        return self.store._now()

    async def jobs(self, name: str | None = None) -> list[JobOverview]:
        """JOBS_OVERVIEW: one row per job, by name."""
        now = self.store._now()
        return [
            self._overview(job, now)
            for job in sorted(self.store.jobs.values(), key=lambda j: j.name)
            if name is None or job.name == name
        ]

    def _overview(self, job: JobRow, now: datetime) -> JobOverview:
        mine = [r for r in self.store.runs.values() if r.job == job.name]
        due = [
            r for r in mine if r.state in (RunState.PENDING, RunState.CLAIMED) and r.due_at <= now
        ]
        last = _newest([r for r in mine if r.state in TERMINAL and r.scheduled_at <= now])
        success = max(
            (r.finished_at for r in mine if r.state is RunState.SUCCEEDED and r.finished_at),
            default=None,
        )
        return {
            **_job_fields(job),
            "created_at": job.created_at,
            "backlog": len(due),
            "oldest_due": min((r.due_at for r in due), default=None),
            "overdue": sum(r.due_at <= now - OVERDUE_AFTER for r in due),
            "ahead": sum(r.state is RunState.PENDING and r.due_at > now for r in mine),
            "running": sum(r.state is RunState.RUNNING for r in mine),
            "last_run_id": last.id if last else None,
            "last_state": last.state.value if last else None,
            "last_outcome": last.outcome if last else None,
            "last_error": last.error if last else None,
            "last_scheduled_at": last.scheduled_at if last else None,
            "last_finished_at": last.finished_at if last else None,
            "last_trigger": last.trigger if last else None,
            "last_success": success,
            "failures_24h": sum(
                r.state is RunState.FAILED and r.scheduled_at > now - timedelta(hours=24)
                for r in mine
            ),
        }

    async def job(self, name: str) -> JobRecord | None:
        """JOB_RECORD."""
        now = self.store._now()
        job = self.store.jobs.get(name)
        if job is None:
            return None
        return cast(JobRecord, {**_job_fields(job), "now": now})

    def _listing(self, run: RunRow) -> RunListing:
        """The run's row as RUNS_PAGE names its columns: every column of ``job_runs`` the
        row holds (a listing's model takes the ones it names), and the job's zone."""
        row: dict[str, Any] = {
            _COLUMN.get(f.name, f.name): _value(getattr(run, f.name)) for f in fields(run)
        }
        return {**row, "timezone": _zone(self.store.jobs[run.job])}

    async def runs(self, wanted: RunFilter) -> list[RunListing]:
        """RUNS_PAGE: newest first by (scheduled_at, id); the cursor is the last row's pair
        (a uuid's order is its canonical text's)."""
        now = self.store._now()
        names = {j.id: j.name for j in self.store.jobs.values()}
        w = wanted
        found = [
            r
            for r in self.store.runs.values()
            if (w.job_id is None or r.job == names.get(w.job_id))
            and (not w.states or r.state.value in w.states)
            and (w.since is None or r.scheduled_at >= w.since)
            and (w.until is None or r.scheduled_at <= w.until)
            and (w.before is None or (r.scheduled_at, r.id) < w.before)
            and (w.ahead or r.scheduled_at <= now)
        ]
        found.sort(key=lambda r: (r.scheduled_at, r.id), reverse=True)
        return [self._listing(r) for r in found[: w.limit]]

    async def run(self, run_id: str) -> tuple[RunDetail, list[AttemptRecord]] | None:
        """RUN_DETAIL and RUN_ATTEMPTS (by finish, then epoch)."""
        now = self.store._now()
        run = self.store.runs.get(run_id)
        if run is None:
            return None
        detail = cast(RunDetail, {**self._listing(run), "output_tail": run.output_tail, "now": now})
        attempts: list[AttemptRecord] = [
            {
                "attempt": a.attempt,
                "claim_epoch": a.epoch,
                "worker": a.worker,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "outcome": a.outcome.value,
                "exit_code": a.exit_code,
                "error": a.error,
                "output_tail": a.output_tail,
            }
            for a in sorted(
                (a for a in self.store.attempts if a.run_id == run_id),
                key=lambda a: (a.finished_at or now, a.epoch),
            )
        ]
        return detail, attempts

    async def audit_records(
        self, job_id: int, start: datetime, end: datetime, limit: int
    ) -> tuple[list[RunRecord], list[Gap]]:
        """AUDIT_RUNS and AUDIT_GAPS."""
        self.store._now()
        name = next((j.name for j in self.store.jobs.values() if j.id == job_id), None)
        runs = sorted(
            (
                r
                for r in self.store.runs.values()
                if r.job == name and start <= r.scheduled_at <= end
            ),
            key=lambda r: r.scheduled_at,
        )[:limit]
        gaps = sorted(
            (g for n, g in self.store.gaps if n == name and g.first <= end and g.last >= start),
            key=lambda g: g.first,
        )
        return [
            RunRecord(
                run_id=r.id,
                scheduled_at=r.scheduled_at,
                state=r.state,
                trigger=r.trigger,
                attempt=r.attempt,
                error=r.error,
                lease_expires_at=r.lease_expires_at,
            )
            for r in runs
        ], gaps

    async def paused_spans(self, job: str) -> list[PausedSpan]:
        """PAUSES, paired as the PostgreSQL adapter pairs them."""
        return (await self.paused_spans_of([job])).get(job, [])

    async def grid_records(
        self, ranges: Sequence[tuple[int, datetime]], end: datetime, limit: int
    ) -> dict[int, Records]:
        """GRID_RUNS and GRID_GAPS: each job's AUDIT_RUNS and AUDIT_GAPS over its range."""
        return {
            job_id: await self.audit_records(job_id, start, end, limit) for job_id, start in ranges
        }

    async def paused_spans_of(self, jobs: Sequence[str]) -> dict[str, list[PausedSpan]]:
        """GRID_PAUSES: the pauses and resumes that took effect, paired per job."""
        self.store._now()
        wanted = set(jobs)
        actions: dict[str, list[tuple[str, datetime]]] = {}
        for row in self.store.actions:
            if row["job"] in wanted and row["ok"] and row["action"] in ("pause", "resume"):
                actions.setdefault(str(row["job"]), []).append((row["action"], row["at"]))
        return {job: pause_spans(found) for job, found in actions.items()}

    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """GENERATIONS and CONFIG_REPLICAS."""
        return await self.store.config_rollout(generations)

    async def rejected_jobs(self) -> list[RejectedRecord]:
        """REJECTED_JOBS."""
        now = self.store._now()
        replica, at = self.store.rejected_by or ("", now)
        out: list[RejectedRecord] = []
        for name in sorted(self.store.rejected):
            r = self.store.rejected[name]
            job = self.store.jobs.get(name)
            out.append(
                {
                    "job": r.job,
                    "path": r.path,
                    "field": r.field,
                    "error": r.error,
                    "replica": replica,
                    "recorded_at": at,
                    "old_definition_running": bool(job and job.enabled),
                }
            )
        return out

    async def last_action_id(self) -> int:
        """LAST_ACTION_ID."""
        self.store._now()
        return max((int(a["id"]) for a in self.store.actions), default=0)

    async def reload_verdict(self, pid: int, after: int) -> tuple[bool, str, dict[str, Any]] | None:
        """RELOAD_VERDICT."""
        self.store._now()
        for a in self.store.actions:
            if (
                a["action"] == "reload"
                and a["via"] == "signal"
                and a["actor"] == "sighup"
                and a["id"] > after
                and json.loads(a["arguments"]).get("pid") == str(pid)
            ):
                details = json.loads(a["arguments"])
                return bool(a["ok"]), str(a["result"]), details if isinstance(details, dict) else {}
        return None

    async def actions(
        self, *, job: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[ActionRecord]:
        """ACTIONS_PAGE: newest first."""
        self.store._now()
        rows = [
            a
            for a in reversed(self.store.actions)
            if (job is None or a["job"] == job) and (before is None or a["id"] < before)
        ]
        return [cast(ActionRecord, dict(a)) for a in rows[:limit]]

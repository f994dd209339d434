"""The job catalog in memory: the jobs table, plans written, what a replica reads besides."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from actors.domain import (
    DecodedJobs,
    Job,
    Overlap,
    Plan,
    RunState,
    SkipReason,
    decode_job,
    encode_job,
    plan_until_removal,
    row_rules,
)
from actors.domain.generations import ConfigIdentity, Generation, judge
from actors.domain.history import Gap
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import (
    Clock,
    ClusterReading,
    JobReading,
    JobState,
    Materialized,
    RejectedJob,
    StoreUnavailable,
)
from actors.ports.messages import ConfigReplica, ConfigReport, ConfigRollout, ConfigSync
from actors.testing.memory_rows import AttemptRow, JobRow, RunRow

NOT_STARTED = (RunState.PENDING, RunState.CLAIMED)


@dataclass
class InMemoryJobCatalog:
    """The rows every in-memory statement reads and writes, on ``clock``'s time.

    ``outage``: while set, every call raises it (a database that is away).
    """

    clock: Clock
    jobs: dict[str, JobRow] = field(default_factory=dict)
    runs: dict[str, RunRow] = field(default_factory=dict)
    attempts: list[AttemptRow] = field(default_factory=list)
    rejected: dict[str, RejectedJob] = field(default_factory=dict)
    rejected_by: tuple[str, datetime] | None = None  # (replica, recorded_at) of the last load
    # The action log, as operator_actions holds it (actors.ports.ActionRecord's keys).
    actions: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[tuple[str, Gap]] = field(default_factory=list)  # (job, instants dropped)
    generations: list[Generation] = field(default_factory=list)  # config_generations, by seq
    # config_replicas: each replica's report and when it expires.
    config_reports: dict[str, tuple[ConfigReplica, datetime]] = field(default_factory=dict)
    outage: Exception | None = None
    closed: bool = False
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _decoded: DecodedJobs = field(default_factory=DecodedJobs)

    # -- helpers -----------------------------------------------------------------------

    def _now(self) -> datetime:
        if self.outage is not None:
            raise self.outage
        if self.closed:
            raise StoreUnavailable("store closed")
        return self.clock.now()

    def _job_of(self, run: RunRow) -> JobRow:
        return self.jobs[run.job]

    def _runs_of(self, job: str) -> list[RunRow]:
        return [r for r in self.runs.values() if r.job == job]

    def _must_not_run(self, run: RunRow, now: datetime) -> SkipReason | None:
        return row_rules.must_not_run(run, self._job_of(run), self._runs_of(run.job), now)

    def _busy(self, job: str) -> bool:
        return row_rules.job_busy(self._runs_of(job))

    def add_run(
        self,
        job: str,
        scheduled_at: datetime,
        *,
        due_at: datetime | None = None,
        trigger: str = "schedule",
        overlap: Overlap | None = None,
    ) -> RunRow:
        """A pending run, as the materializer, a trigger or a backfill writes it."""
        run = RunRow(
            str(uuid.uuid4()),
            job,
            scheduled_at,
            due_at or scheduled_at,
            trigger=trigger,
            overlap=overlap,
        )
        self.runs[run.id] = run
        return run

    def in_state(self, *states: RunState) -> list[RunRow]:
        return sorted(
            (r for r in self.runs.values() if r.state in states), key=lambda r: r.scheduled_at
        )

    # -- what a replica needs beyond the port -----------------------------------------

    async def migrate(self) -> list[str]:
        self._now()
        return []

    async def close(self) -> None:
        self.closed = True

    async def ping(self) -> None:
        self._now()

    async def database_now(self) -> datetime:
        return self._now()

    async def jobs_summary(self) -> list[dict[str, Any]]:
        """The status page's job list (JOBS_SUMMARY)."""
        self._now()
        out = []
        for name in sorted(self.jobs):
            job = self.jobs[name]
            mine = [r for r in self.runs.values() if r.job == name]
            done = [r.finished_at for r in mine if r.state is RunState.SUCCEEDED and r.finished_at]
            out.append(
                {
                    "name": name,
                    "enabled": job.enabled,
                    "paused": job.paused,
                    "pending": sum(r.state is RunState.PENDING for r in mine),
                    "last_success": str(max(done)) if done else None,
                }
            )
        return out

    async def cluster_figures(self, timeout: float) -> ClusterReading:
        """The cluster gauges' reading, simplified: job figures without overdue ages."""
        now = self._now()
        readings = []
        for job in sorted(self.jobs.values(), key=lambda j: j.name):
            if not job.enabled:
                continue
            mine = [r for r in self.runs.values() if r.job == job.name]
            ok = [r.finished_at for r in mine if r.state is RunState.SUCCEEDED and r.finished_at]
            bad = [r.finished_at for r in mine if r.state is RunState.FAILED and r.finished_at]
            overdue = [r for r in mine if r.state is RunState.PENDING and r.due_at <= now]
            readings.append(
                JobReading(
                    name=job.name,
                    paused=job.paused,
                    fingerprint=job.fingerprint,
                    definition=job.definition,
                    last_success=max(ok, default=None),
                    last_failure=max(bad, default=None),
                    overdue=0 if job.paused else len(overdue),
                    overdue_oldest_age=max(
                        ((now - r.due_at).total_seconds() for r in overdue), default=0.0
                    ),
                    materialized_behind=0.0,
                )
            )
        return ClusterReading(
            jobs=tuple(readings),
            claimed=len(self.in_state(RunState.CLAIMED)),
            running=len(self.in_state(RunState.RUNNING)),
            past_lease=sum(row_rules.lease_expired(r, now) for r in self.runs.values()),
        )

    async def record_reload(
        self,
        replica_id: str,
        arguments: dict[str, Any],
        ok: bool,
        result: str,
        *,
        by_signal: bool = True,
    ) -> None:
        """The operator action a reload leaves (record_action)."""
        actor = "sighup" if by_signal else "config-watch"
        self.record(
            actor, "signal", replica_id, "reload", arguments=arguments, ok=ok, result=result
        )

    def record(
        self,
        actor: str,
        via: str,
        origin: str | None,
        action: str,
        *,
        job: str | None = None,
        run_id: str | None = None,
        arguments: dict[str, Any] | None = None,
        ok: bool,
        result: str,
    ) -> dict[str, Any]:
        """RECORD_ACTION: one row of the action log, its id the next, at the store's now."""
        row = {
            "id": len(self.actions) + 1,
            "at": self._now(),
            "actor": actor,
            "via": via,
            "origin": origin,
            "action": action,
            "job": job,
            "run_id": run_id,
            "arguments": json.dumps(arguments or {}, default=str, ensure_ascii=False),
            "ok": ok,
            "result": result,
        }
        self.actions.append(row)
        return row

    async def record_rejected_jobs(self, replica_id: str, rejected: Sequence[RejectedJob]) -> None:
        """CLEAR_REJECTED_JOBS, RECORD_REJECTED_JOBS: the last load's set, whole."""
        now = self._now()
        self.rejected = {r.job: r for r in rejected}
        self.rejected_by = (replica_id, now)

    # -- the job catalog --------------------------------------------------------------

    async def sync_config(
        self,
        jobs: Sequence[Job],
        file: ConfigIdentity,
        replica_id: str,
        *,
        keep: Sequence[str] = (),
        force: bool = False,
    ) -> ConfigSync:
        """GENERATION_IN_FORCE, DIGEST_SEEN, judged; then sync_jobs and RECORD_GENERATION."""
        now = self._now()
        in_force = self.generations[-1] if self.generations else None
        seen = any(g.digest == file.digest for g in self.generations)
        standing = judge(file, in_force, seen_before=seen, force=force)
        if not standing.applies:
            assert in_force is not None
            return ConfigSync(standing, in_force)
        changes = await self.sync_jobs(jobs, keep)
        if standing.records:
            seq = self.generations[-1].seq + 1 if self.generations else 1
            in_force = Generation(seq, file.digest, file.version, now, replica_id, force)
            self.generations.append(in_force)
        assert in_force is not None
        return ConfigSync(standing, in_force, changes)

    async def report_config(self, report: ConfigReport) -> None:
        """REPORT_CONFIG."""
        now = self._now()
        self.config_reports = {
            k: v for k, v in self.config_reports.items() if v[1] >= now or k == report.replica
        }
        row = ConfigReplica(
            report.replica,
            report.file.digest,
            report.file.version,
            report.stale,
            report.path,
            now,
        )
        self.config_reports[report.replica] = (row, now + report.ttl)

    async def forget_config_replica(self, replica_id: str) -> None:
        """FORGET_CONFIG_REPLICA."""
        self._now()
        self.config_reports.pop(replica_id, None)

    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """GENERATIONS and CONFIG_REPLICAS."""
        now = self._now()
        return ConfigRollout(
            generations=tuple(reversed(self.generations[-generations:])),
            replicas=tuple(
                row for _, (row, until) in sorted(self.config_reports.items()) if until >= now
            ),
        )

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]:
        """UPSERT_JOB, WITHDRAW_FUTURE_RUNS on a changed schedule (RESTORE_READDED_JOB on
        a job back in the config), DISABLE_REMOVED_JOBS."""
        now = self._now()
        changes: dict[str, str] = {}
        for job in sorted(jobs, key=lambda j: j.name):
            definition = encode_job(job)
            old = self.jobs.get(job.name)
            if old is not None and (old.fingerprint, old.enabled) == (
                job.fingerprint(),
                job.enabled,
            ):
                continue
            row = JobRow(
                id=old.id if old else next(self._ids),
                name=job.name,
                definition=json.dumps(definition),
                fingerprint=job.fingerprint(),
                enabled=job.enabled,
                max_attempts=job.max_attempts,
                overlap=job.overlap,
                catchup=job.catchup,
                start_deadline=job.start_deadline(),
                paused=old.paused if old else False,
                materialized_until=old.materialized_until if old else None,
                created_at=old.created_at if old else now,
                # UPSERT_JOBS leaves the retention mark alone (sql/0012).
                history_pruned_through=old.history_pruned_through if old else None,
                planned_since=old.planned_since if old else None,
            )
            self.jobs[job.name] = row
            if old is None:
                changes[job.name] = "added"
                continue
            changes[job.name] = "changed"
            if job.enabled and not old.enabled:
                # RESTORE_READDED_JOB: back in the config, what the removal
                # cancelled ahead (and anything not started) is planned again.
                self._withdraw_ahead(job.name, now, also_cancelled_by_removal=True)
                row.materialized_until = row.planned_since = now
            elif json.loads(old.definition)["schedule"] != definition["schedule"]:
                self._withdraw_ahead(job.name, now)
                row.materialized_until = row.planned_since = now
        names = {job.name for job in jobs} | set(keep)
        for row in self.jobs.values():
            if row.enabled and row.name not in names:
                self._plan_until_removal(row, now)
                row.enabled = False
                changes[row.name] = "removed"
                for run in self.runs.values():
                    if run.job == row.name and run.state in NOT_STARTED:
                        run.finish(RunState.CANCELLED, now, REMOVED_FROM_CONFIG)
        return changes

    def _plan_until_removal(self, row: JobRow, now: datetime) -> None:
        """REMOVED_JOBS_TO_PLAN, RECORD_GAPS, INSERT_RUNS_UNTIL_REMOVAL, ADVANCE_MARKS_TO_REMOVAL:
        the instants due since the last plan get rows (cancelled below with the others)."""
        if row.paused:
            return
        plan = plan_until_removal(
            decode_job(row.name, row.definition),
            row.materialized_until,
            now,
            first_seen=row.created_at,
        )
        for gap in plan.dropped:
            if not any(
                name == row.name and old.first <= gap.last and old.last >= gap.first
                for name, old in self.gaps
            ):
                self.gaps.append((row.name, gap))
        taken = {r.scheduled_at for r in self.runs.values() if r.job == row.name}
        for planned in plan.runs:
            if planned.scheduled_at not in taken:
                self.add_run(row.name, planned.scheduled_at, due_at=planned.due_at)
        row.materialized_until = max(
            row.materialized_until or plan.materialized_until, plan.materialized_until
        )

    def _withdraw_ahead(
        self, job: str, now: datetime, *, also_cancelled_by_removal: bool = False
    ) -> None:
        """WITHDRAW_FUTURE_RUNS (and RESTORE_READDED_JOB's wider choice of rows)."""
        for run in list(self.runs.values()):
            taken_back = run.state in NOT_STARTED or (
                also_cancelled_by_removal
                and run.state is RunState.CANCELLED
                and run.error == REMOVED_FROM_CONFIG
            )
            if (
                run.job == job
                and taken_back
                and run.trigger == "schedule"
                and run.scheduled_at > now
            ):
                del self.runs[run.id]

    async def active_jobs(self) -> dict[str, JobState]:
        """ACTIVE_JOBS."""
        self._now()
        return {
            j.name: JobState(
                id=j.id,
                name=j.name,
                materialized_until=j.materialized_until,
                paused=j.paused,
                fingerprint=j.fingerprint,
                definition=j.definition,
                created_at=j.created_at,
            )
            for j in self.jobs.values()
            if j.enabled
        }

    async def catalog_version(self) -> int:
        """CATALOG_VERSION: here derived from what the trigger of sql/0009 watches."""
        self._now()
        return hash(
            tuple(
                (j.id, j.fingerprint, j.enabled, j.paused, j.created_at) for j in self.jobs.values()
            )
        )

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        """ADVANCE_HIGH_WATER (fenced: fingerprint, mark, freshness), CURRENT_MARKS,
        RECORD_GAPS, INSERT_PLANNED_RUNS."""
        now = self._now()
        if fresh_until is not None and now > fresh_until:
            return Materialized(stale=True)
        by_id = {j.id: j for j in self.jobs.values()}
        taken = {(r.job, r.scheduled_at) for r in self.runs.values()}
        inserted = 0
        missed: dict[int, int] = {}
        written: set[int] = set()
        moved: dict[int, datetime | None] = {}
        superseded: set[int] = set()
        for state, plan in plans:
            job = by_id.get(state.id)
            if job is None or not job.enabled or job.fingerprint != state.fingerprint:
                if job is not None:
                    superseded.add(job.id)
                continue  # a plan from a superseded definition writes nothing
            if job.materialized_until != state.materialized_until:
                moved[job.id] = job.materialized_until
                continue  # planned from a mark that has moved since
            written.add(job.id)
            # What the plan dropped, recorded with it: no silent hole in history;
            # a gap overlapping one already recorded (another replica's) is not.
            for gap in plan.dropped:
                if any(
                    name == job.name and old.first <= gap.last and old.last >= gap.first
                    for name, old in self.gaps
                ):
                    continue
                self.gaps.append((job.name, gap))
                missed[job.id] = missed.get(job.id, 0) + gap.count
            job.materialized_until = max(
                job.materialized_until or plan.materialized_until, plan.materialized_until
            )
            for planned in plan.runs:
                if (job.name, planned.scheduled_at) in taken:
                    continue  # ON CONFLICT (job_id, scheduled_at) DO NOTHING
                taken.add((job.name, planned.scheduled_at))
                self.add_run(job.name, planned.scheduled_at, due_at=planned.due_at)
                inserted += 1
        return Materialized(
            inserted, missed, frozenset(written), moved, superseded=frozenset(superseded)
        )

    async def set_paused(self, job: str, paused: bool) -> None:
        """What `claimd pause` / `resume` change (SET_PAUSED): a pause hands back claims."""
        self._now()
        if not self.jobs[job].enabled:
            return  # WHERE name = $1 AND enabled: a removed job is not paused
        self.jobs[job].paused = paused
        if not paused:
            return
        for run in self.runs.values():
            if run.job == job and run.state is RunState.CLAIMED:
                run.hand_back()  # the epoch stays: its message is stale

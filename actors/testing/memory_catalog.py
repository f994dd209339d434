"""The job catalog in memory: the jobs table synced from the config, the plans written,
pauses, and the config generations in force."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from actors.domain import (
    Job,
    Plan,
    RunState,
    decode_job,
    encode_job,
    plan_until_removal,
)
from actors.domain.generations import Generation, judge
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import JobState, Materialized
from actors.ports.messages import (
    ConfigLoad,
    ConfigReplica,
    ConfigReport,
    ConfigRollout,
    ConfigSync,
)
from actors.ports.translator import reads_only
from actors.testing.memory_rows import JobRow
from actors.testing.memory_tables import InMemoryTables

NOT_STARTED = (RunState.PENDING, RunState.CLAIMED)


class InMemoryJobCatalog(InMemoryTables):
    """The catalog's statements (the PlanningStore port and the config's sync) on the rows."""

    # -- the job catalog --------------------------------------------------------------

    async def sync_config(
        self, load: ConfigLoad, replica_id: str, *, force: bool = False
    ) -> ConfigSync:
        """GENERATION_IN_FORCE, DIGEST_SEEN, judged; then sync_jobs and RECORD_GENERATION."""
        now = self._now()
        file = load.file
        in_force = self.generations[-1] if self.generations else None
        seen = any(g.digest == file.digest for g in self.generations)
        standing = judge(file, in_force, seen_before=seen, force=force)
        if not standing.applies:
            assert in_force is not None
            return ConfigSync(standing, in_force)
        changes = await self.sync_jobs(load.jobs, load.keep)
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

    @reads_only
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

    @reads_only
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

    @reads_only
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

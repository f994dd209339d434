"""The job catalog: the config's jobs synced into ``jobs``, the active ones read back,
their plans written."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from actors.adapters.history import Actor, record_action, record_gaps
from actors.adapters.postgres.errors import store_methods_report_outages
from actors.adapters.postgres.statements import (
    ACTIVE_JOBS,
    ADVANCE_HIGH_WATER,
    DATABASE_NOW,
    DISABLE_REMOVED_JOBS,
    INSERT_PLANNED_RUNS,
    JOBS_SUMMARY,
    LOCK_JOBS_FOR_SYNC,
    REMOVED_JOBS,
    RESTORE_READDED_JOB,
    UPSERT_JOB,
    WITHDRAW_FUTURE_RUNS,
)
from actors.adapters.postgres.stored_definitions import StoredDefinitions
from actors.domain import Job, Plan, encode_job
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import JobState, Materialized


@store_methods_report_outages
class PostgresJobCatalog:
    """The jobs table: what the config declares, what every replica plans from."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._definitions = StoredDefinitions()

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]:
        """Upsert the config's jobs; disable those gone from it (but not ``keep``).

        Returns what happened to each job whose row changed: added, changed,
        removed (a job added back after a removal is "changed", and gets every
        instant ahead planned again: RESTORE_READDED_JOB).
        """
        changes: dict[str, str] = {}
        names = [job.name for job in jobs] + list(keep)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.fetch(LOCK_JOBS_FOR_SYNC, names)
            for job in sorted(jobs, key=lambda j: j.name):
                definition = encode_job(job)
                row = await conn.fetchrow(
                    UPSERT_JOB,
                    job.name,
                    json.dumps(definition),
                    job.fingerprint(),
                    job.enabled,
                    job.max_attempts,
                    job.overlap.value,
                    job.catchup.value,
                    job.start_deadline(),
                )
                if row is None:
                    continue
                if row["inserted"]:
                    changes[job.name] = "added"
                    continue
                changes[job.name] = "changed"
                old_schedule = row["old_schedule"]
                rescheduled = (
                    old_schedule is not None and json.loads(old_schedule) != definition["schedule"]
                )
                if job.enabled and row["was_enabled"] is False:
                    # Back in the config: what the removal cancelled ahead is
                    # planned again (this also covers a changed schedule).
                    await conn.fetchval(RESTORE_READDED_JOB, row["id"], REMOVED_FROM_CONFIG)
                elif rescheduled:
                    await conn.fetchval(WITHDRAW_FUTURE_RUNS, row["id"])
            removed = await conn.fetch(REMOVED_JOBS, names)
            await conn.fetch(DISABLE_REMOVED_JOBS, names, REMOVED_FROM_CONFIG)
            for r in removed:
                changes[r["name"]] = "removed"
        return changes

    async def database_now(self) -> datetime:
        """The database's clock (``now()``): what every decision about time is made on."""
        value: datetime = await self._pool.fetchval(DATABASE_NOW)
        return value

    async def jobs_summary(self) -> list[dict[str, Any]]:
        """The status page's job list, as JSON-ready values (instants as text)."""
        rows = await self._pool.fetch(JOBS_SUMMARY)
        return [json.loads(json.dumps(dict(r), default=str)) for r in rows]

    async def record_reload(
        self, replica_id: str, arguments: dict[str, Any], ok: bool, result: str
    ) -> None:
        """The operator action a SIGHUP reload leaves (what `claimd reload` waits for)."""
        await record_action(
            self._pool,
            Actor("sighup", "signal", replica_id),
            "reload",
            arguments=arguments,
            ok=ok,
            result=result,
        )

    async def active_jobs(self) -> dict[str, JobState]:
        """The enabled jobs; one whose definition changed during this read is left to the next."""
        rows = await self._pool.fetch(ACTIVE_JOBS)
        definitions = await self._definitions.of(self._pool, rows, every_job=True)
        return {
            r["name"]: JobState(
                id=r["id"],
                name=r["name"],
                materialized_until=r["materialized_until"],
                paused=r["paused"],
                fingerprint=r["fingerprint"],
                definition=definitions[r["id"]],
                created_at=r["created_at"],
            )
            for r in rows
            if r["id"] in definitions
        }

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        """Insert every planned run of several jobs and advance their marks, in one go.

        With ``fresh_until``, nothing is written once the database's now() is past it.
        """
        job_ids: list[int] = []
        scheduled: list[datetime] = []
        due: list[datetime] = []
        for job, plan in plans:
            for run in plan.runs:
                job_ids.append(job.id)
                scheduled.append(run.scheduled_at)
                due.append(run.due_at)
        async with self._pool.acquire() as conn, conn.transaction():
            current = await conn.fetch(
                ADVANCE_HIGH_WATER,
                [j.id for j, _ in plans],
                [p.materialized_until for _, p in plans],
                [j.fingerprint for j, _ in plans],
                fresh_until,
            )
            if not current:
                return Materialized()
            # What the plans dropped, recorded with them: no silent hole in history.
            missed = await record_gaps(
                conn,
                [r["id"] for r in current],
                [(job.id, gap) for job, plan in plans for gap in plan.dropped],
            )
            if not job_ids:
                return Materialized(0, missed)
            status = await conn.execute(
                INSERT_PLANNED_RUNS, job_ids, scheduled, due, [r["id"] for r in current]
            )
        return Materialized(int(status.split()[-1]), missed)

"""The job catalog: the config's jobs synced into ``jobs``, the active ones read back,
their plans written."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TypeVar

import asyncpg

from actors.adapters.postgres.errors import POSTGRES, POSTGRES_HEALTH, reads_only
from actors.adapters.postgres.generations import (
    forget_replica,
    judge_locked,
    read_rollout,
    record_generation,
    write_report,
)
from actors.adapters.postgres.history import record_action, record_gaps
from actors.adapters.postgres.statements import (
    ACTIVE_JOBS,
    ADVANCE_HIGH_WATER,
    ADVANCE_MARKS_TO_REMOVAL,
    CATALOG_VERSION,
    CLEAR_REJECTED_JOBS,
    CURRENT_MARKS,
    DATABASE_NOW,
    DISABLE_REMOVED_JOBS,
    INSERT_PLANNED_RUNS,
    INSERT_RUNS_UNTIL_REMOVAL,
    JOBS_AS_SYNCED,
    LOCK_JOBS_FOR_SYNC,
    LOCK_SYNC,
    OLD_SCHEDULES,
    PLAN_IS_FRESH,
    RECORD_REJECTED_JOBS,
    REMOVED_JOBS,
    REMOVED_JOBS_TO_PLAN,
    RESTORE_READDED_JOB,
    TRY_LOCK_SYNC,
    UPSERT_JOBS,
    WITHDRAW_FUTURE_RUNS,
)
from actors.adapters.postgres.stored_definitions import StoredDefinitions
from actors.clocks import Stopwatch
from actors.domain import (
    Job,
    Plan,
    UnreadableDefinition,
    decode_job,
    encode_job,
    plan_until_removal,
)
from actors.domain.history import Gap
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.observability import DependencyHealth, get_logger
from actors.ports import Action, Caller, JobState, Materialized, RejectedJob
from actors.ports.messages import ConfigLoad, ConfigReport, ConfigRollout, ConfigSync
from actors.ports.translator import speaks_the_port

# Jobs written per upsert statement: bounded parameter arrays, one statement
# of a few hundred milliseconds at most.
SYNC_CHUNK = 5_000
SYNC_LOCK_WAIT_S = 600.0  # the longest a sync waits for another's to finish
log = get_logger("catalog")
T = TypeVar("T")


async def _take_sync_lock(conn: asyncpg.Connection) -> None:
    """LOCK_SYNC: at once, or once another replica's sync (its transaction) ends.

    The wait is a lock wait (seen in pg_locks) with its own deadline, not the
    statement's: another sync may rightly hold the lock for many seconds.
    """
    if await conn.fetchval(TRY_LOCK_SYNC):
        return
    log.info("job sync: another replica is syncing; waiting for it to finish")
    waited = Stopwatch()
    await conn.execute(LOCK_SYNC, timeout=SYNC_LOCK_WAIT_S)
    log.info(
        "job sync: the other replica's sync finished",
        waited_s=round(waited.seconds(), 1),
    )


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def _plan_until_removal(conn: asyncpg.Connection, job_ids: Sequence[int]) -> None:
    """Rows for the instants the jobs about to be disabled came due at since their last plan.

    DISABLE_REMOVED_JOBS then cancels them with the job's other runs not
    started: an instant due while the job was in the config is accounted for
    (a row, or a gap the catch-up policy recorded), even when the removal
    comes before any tick planned it (REMOVED_JOBS_TO_PLAN).
    """
    ids: list[int] = []
    runs_of: list[int] = []
    scheduled: list[datetime] = []
    due: list[datetime] = []
    marks: list[datetime] = []
    gaps: list[tuple[int, Gap]] = []
    for row in await conn.fetch(REMOVED_JOBS_TO_PLAN, list(job_ids)):
        try:
            job = decode_job(row["name"], row["definition"])
        except UnreadableDefinition:
            continue  # no tick could plan it either
        plan = plan_until_removal(
            job, row["materialized_until"], row["now"], first_seen=row["created_at"]
        )
        ids.append(row["id"])
        marks.append(plan.materialized_until)
        gaps.extend((row["id"], gap) for gap in plan.dropped)
        for run in plan.runs:
            scheduled.append(run.scheduled_at)
            due.append(run.due_at)
        runs_of.extend([row["id"]] * len(plan.runs))
    if not ids:
        return
    await record_gaps(conn, ids, gaps)
    await conn.execute(INSERT_RUNS_UNTIL_REMOVAL, runs_of, scheduled, due)
    await conn.execute(ADVANCE_MARKS_TO_REMOVAL, ids, marks)


@speaks_the_port(POSTGRES)
class PostgresJobCatalog:
    """The jobs table: what the config declares, what every replica plans from."""

    health: DependencyHealth | None = POSTGRES_HEALTH  # what its calls report to

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._definitions = StoredDefinitions()

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]:
        """Upsert the config's jobs; disable those gone from it (but not ``keep``).

        Returns what happened to each job whose row changed: added, changed,
        removed. Only those rows are written: the table is read first, and a
        job whose definition and enabled flag are as stored costs nothing. A
        job added back after a removal is "changed", and gets every instant
        ahead planned again (RESTORE_READDED_JOB).
        """
        async with self._pool.acquire() as conn, conn.transaction():
            await _take_sync_lock(conn)
            return await self._sync_locked(conn, jobs, keep)

    async def sync_config(
        self, load: ConfigLoad, replica_id: str, *, force: bool = False
    ) -> ConfigSync:
        """``sync_jobs`` under the rollout rule, judged and applied in one turn of the lock."""
        file = load.file
        async with self._pool.acquire() as conn, conn.transaction():
            await _take_sync_lock(conn)
            standing, in_force = await judge_locked(conn, file, force=force)
            if not standing.applies:
                assert in_force is not None  # a stale file is judged against one
                return ConfigSync(standing, in_force)
            changes = await self._sync_locked(conn, load.jobs, load.keep)
            if standing.records:
                in_force = await record_generation(conn, file, replica_id, forced=force)
            assert in_force is not None
            return ConfigSync(standing, in_force, changes)

    async def report_config(self, report: ConfigReport) -> None:
        """REPORT_CONFIG."""
        await write_report(self._pool, report)

    async def forget_config_replica(self, replica_id: str) -> None:
        """FORGET_CONFIG_REPLICA: a replica that stops cleanly takes its report away."""
        await forget_replica(self._pool, replica_id)

    @reads_only
    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """GENERATIONS and CONFIG_REPLICAS."""
        return await read_rollout(self._pool, generations)

    async def _sync_locked(
        self, conn: asyncpg.Connection, jobs: Sequence[Job], keep: Sequence[str]
    ) -> dict[str, str]:
        changes: dict[str, str] = {}
        names = [job.name for job in jobs] + list(keep)
        wanted = set(names)
        stored = {r["name"]: r for r in await conn.fetch(JOBS_AS_SYNCED)}
        # (job, fingerprint): encoded a chunk at a time below, so that a sync
        # of 100,000 new jobs never holds every definition at once.
        rows: list[tuple[Job, str]] = []
        # In a thread: a digest of each job's definition, seconds for 100,000.
        fingerprints = await asyncio.to_thread(lambda: [job.fingerprint() for job in jobs])
        for job, fingerprint in zip(jobs, fingerprints, strict=True):
            old = stored.get(job.name)
            if old is None or (old["fingerprint"], old["enabled"]) != (
                fingerprint,
                job.enabled,
            ):
                rows.append((job, fingerprint))
        removed_ids = [r["id"] for r in stored.values() if r["enabled"] and r["name"] not in wanted]
        changed_ids = [stored[j.name]["id"] for j, _ in rows if j.name in stored]
        await conn.fetch(LOCK_JOBS_FOR_SYNC, sorted(changed_ids + removed_ids))
        old_schedules = {
            r["id"]: r["schedule"] for r in await conn.fetch(OLD_SCHEDULES, changed_ids)
        }
        rows.sort(key=lambda row: row[0].name)
        stored_enabled = {name: r["enabled"] for name, r in stored.items()}
        by_name_enabled = {job.name: job.enabled for job, _ in rows}
        for chunk in _chunks(rows, SYNC_CHUNK):
            by_name = {job.name: encode_job(job) for job, _ in chunk}
            written = await conn.fetch(
                UPSERT_JOBS,
                [job.name for job, _ in chunk],
                [json.dumps(by_name[job.name]) for job, _ in chunk],
                [fingerprint for _, fingerprint in chunk],
                [job.enabled for job, _ in chunk],
                [job.max_attempts for job, _ in chunk],
                [job.overlap.value for job, _ in chunk],
                [job.catchup.value for job, _ in chunk],
                [job.start_deadline() for job, _ in chunk],
            )
            for row in written:
                if row["inserted"]:
                    changes[row["name"]] = "added"
                    continue
                changes[row["name"]] = "changed"
                old_schedule = old_schedules.get(row["id"])
                new_schedule = by_name[row["name"]]["schedule"]
                rescheduled = old_schedule is not None and json.loads(old_schedule) != new_schedule
                if by_name_enabled[row["name"]] and stored_enabled.get(row["name"]) is False:
                    # Back in the config: what the removal cancelled ahead is
                    # planned again (this also covers a changed schedule).
                    await conn.fetchval(RESTORE_READDED_JOB, row["id"], REMOVED_FROM_CONFIG)
                elif rescheduled:
                    await conn.fetchval(WITHDRAW_FUTURE_RUNS, row["id"])
        if removed_ids:
            await _plan_until_removal(conn, removed_ids)
            removed = await conn.fetch(REMOVED_JOBS, names)
            await conn.fetch(DISABLE_REMOVED_JOBS, names, REMOVED_FROM_CONFIG)
            for r in removed:
                changes[r["name"]] = "removed"
        return changes

    @reads_only
    async def database_now(self) -> datetime:
        """The database's clock (``now()``): what every decision about time is made on."""
        value: datetime = await self._pool.fetchval(DATABASE_NOW)
        return value

    async def record_reload(
        self, replica_id: str, reload: Action, *, by_signal: bool = True
    ) -> None:
        """The operator action a reload leaves (a signal's: what `claimd reload` waits for)."""
        await record_action(
            self._pool,
            Caller("sighup", "signal", replica_id)
            if by_signal
            else Caller("config-watch", "signal", replica_id),
            reload,
        )

    async def record_rejected_jobs(self, replica_id: str, rejected: Sequence[RejectedJob]) -> None:
        """CLEAR_REJECTED_JOBS then RECORD_REJECTED_JOBS, in one transaction."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(CLEAR_REJECTED_JOBS)
            if rejected:
                await conn.execute(
                    RECORD_REJECTED_JOBS,
                    [r.job for r in rejected],
                    [r.path for r in rejected],
                    [r.field for r in rejected],
                    [r.error for r in rejected],
                    replica_id,
                )

    @reads_only
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
                fingerprint=self._definitions.fingerprint(r["fingerprint"]),
                definition=definitions[r["id"]],
                created_at=r["created_at"],
            )
            for r in rows
            if r["id"] in definitions
        }

    @reads_only
    async def catalog_version(self) -> int:
        """CATALOG_VERSION: moves with every change of what ``active_jobs`` answers."""
        version: int = await self._pool.fetchval(CATALOG_VERSION)
        return version

    async def materialize_many(
        self, plans: Sequence[tuple[JobState, Plan]], fresh_until: datetime | None = None
    ) -> Materialized:
        """Insert every planned run of several jobs and advance their marks, in one go.

        A plan is written only from the mark its JobState carries; the others are
        answered in ``moved`` with the mark now, or in ``superseded`` when the job
        was disabled or redefined since that JobState was read. With ``fresh_until``, nothing is
        written once the database's now() is past it (``stale``).
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
            if not await conn.fetchval(PLAN_IS_FRESH, fresh_until):
                return Materialized(stale=True)
            current = await conn.fetch(
                ADVANCE_HIGH_WATER,
                [j.id for j, _ in plans],
                [p.materialized_until for _, p in plans],
                [j.fingerprint for j, _ in plans],
                fresh_until,
                [j.materialized_until for j, _ in plans],
            )
            written = frozenset(r["id"] for r in current)
            planned_with = {j.id: j.fingerprint for j, _ in plans}
            refused = [j.id for j, _ in plans if j.id not in written]
            moved: dict[int, datetime | None] = {}
            superseded: set[int] = set()
            for r in await conn.fetch(CURRENT_MARKS, refused) if refused else []:
                if r["enabled"] and r["fingerprint"] == planned_with[r["id"]]:
                    moved[r["id"]] = r["materialized_until"]
                else:  # removed or redefined since it was read: not a moved mark
                    superseded.add(r["id"])
            if not current:
                return Materialized(moved=moved, superseded=frozenset(superseded))
            # What the plans dropped, recorded with them: no silent hole in history.
            missed = await record_gaps(
                conn,
                [r["id"] for r in current],
                [(job.id, gap) for job, plan in plans for gap in plan.dropped],
            )
            if not job_ids:
                return Materialized(0, missed, written, moved, frozenset(superseded))
            status = await conn.execute(
                INSERT_PLANNED_RUNS, job_ids, scheduled, due, [r["id"] for r in current]
            )
        return Materialized(int(status.split()[-1]), missed, written, moved, frozenset(superseded))

"""Config generations on PostgreSQL (sql/0013): judged under the sync lock, and the
replicas' reports of their config file."""

from __future__ import annotations

import asyncpg

from actors.adapters.postgres.statements.config import (
    CONFIG_REPLICAS,
    DIGEST_SEEN,
    FORGET_CONFIG_REPLICA,
    GENERATION_IN_FORCE,
    GENERATIONS,
    RECORD_GENERATION,
    REPORT_CONFIG,
)
from actors.domain.generations import ConfigIdentity, Generation, Standing, judge
from actors.ports.messages import ConfigReplica, ConfigReport, ConfigRollout


def _generation(row: asyncpg.Record) -> Generation:
    return Generation(
        seq=row["seq"],
        digest=row["digest"],
        version=row["config_version"],
        first_seen_at=row["first_seen_at"],
        replica=row["replica"],
        forced=row["forced"],
    )


async def judge_locked(
    conn: asyncpg.Connection, file: ConfigIdentity, *, force: bool
) -> tuple[Standing, Generation | None]:
    """The file's standing against the generation in force (the caller holds LOCK_SYNC)."""
    row = await conn.fetchrow(GENERATION_IN_FORCE)
    in_force = _generation(row) if row is not None else None
    seen = bool(await conn.fetchval(DIGEST_SEEN, file.digest))
    return judge(file, in_force, seen_before=seen, force=force), in_force


async def record_generation(
    conn: asyncpg.Connection, file: ConfigIdentity, replica_id: str, *, forced: bool
) -> Generation:
    """RECORD_GENERATION: the file's jobs are the generation in force from now on."""
    row = await conn.fetchrow(RECORD_GENERATION, file.digest, file.version, replica_id, forced)
    return _generation(row)


async def write_report(db: asyncpg.Pool, report: ConfigReport) -> None:
    await db.execute(
        REPORT_CONFIG,
        report.replica,
        report.file.digest,
        report.file.version,
        report.stale,
        report.path,
        report.ttl.total_seconds(),
    )


async def forget_replica(db: asyncpg.Pool, replica_id: str) -> None:
    await db.execute(FORGET_CONFIG_REPLICA, replica_id)


async def read_rollout(db: asyncpg.Pool, generations: int) -> ConfigRollout:
    return ConfigRollout(
        generations=tuple(_generation(r) for r in await db.fetch(GENERATIONS, generations)),
        replicas=tuple(
            ConfigReplica(
                replica=r["replica"],
                file_digest=r["file_digest"],
                config_version=r["config_version"],
                stale=r["stale"],
                path=r["path"],
                seen_at=r["seen_at"],
            )
            for r in await db.fetch(CONFIG_REPLICAS)
        ),
    )

"""Migrations and readers never deadlock: a migration takes its locks first, and gives way.

A reader (a dashboard, `claimd status`, the status page) may hold a lock on one
table and ask for another, in whatever order its query names them; a
migration altering both in the other order forms a cycle, and PostgreSQL
aborts one of the two after deadlock_timeout. The interleaving is forced
here: a reader's transaction reads job_runs, the migration to sql/0002 (which
alters jobs, then job_runs) starts and waits for job_runs, and only then does
the reader read jobs.

Each migration now takes the locks it declares (``-- lock: TABLE IN MODE
MODE`` lines) before its body, with a lock_timeout under deadlock_timeout:
the migration is the waiter that gives up, rolls back (letting the reader
on), says so, and tries again. The second test holds every declaration to the
locks its migration really takes.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from structlog.testing import capture_logs

from actors.adapters.postgres.migrations import (
    CREATE_MIGRATIONS_TABLE,
    LOCK_MODES,
    RECORD_MIGRATION,
    MigrationLocked,
    migrate,
    migrations,
)
from tests.integration.helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAITING_ON = """
SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = $1 AND NOT l.granted
"""
# The relation locks this transaction holds on the schema's tables, strongest first.
HELD_ON_TABLES = """
SELECT c.relname, l.mode FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted
   AND c.relkind IN ('r', 'p') AND c.relnamespace = current_schema()::regnamespace
"""
TABLES = """
SELECT relname FROM pg_class
 WHERE relkind IN ('r', 'p') AND relnamespace = current_schema()::regnamespace
"""


async def _migrated_through(conn: asyncpg.Connection, last: int) -> None:
    """The schema as a build whose newest migration is ``last`` left it."""
    await conn.execute(CREATE_MIGRATIONS_TABLE)
    for migration in migrations():
        if migration.version > last:
            break
        await conn.execute(migration.path.read_text(encoding="utf-8"))
        await conn.execute(RECORD_MIGRATION, migration.version, migration.name)


async def test_a_reader_holding_one_table_and_asking_for_another_does_not_deadlock_a_migration(
    schema_url: str,
) -> None:
    reader = await asyncpg.connect(schema_url)
    migrator = await asyncpg.connect(schema_url)
    try:
        await _migrated_through(migrator, 1)
        transaction = reader.transaction()
        await transaction.start()
        await reader.fetchval("SELECT count(*) FROM job_runs")  # holds job_runs
        pid = migrator.get_server_pid()
        with capture_logs() as logs:
            migrating = asyncio.create_task(migrate(migrator))

            async def migration_waits_for_job_runs() -> bool:
                return "job_runs" in {r["relname"] for r in await reader.fetch(WAITING_ON, pid)}

            await eventually(
                migration_waits_for_job_runs, what="the migration waiting for job_runs"
            )
            # The other table, while the migration waits for the first: the cycle.
            assert await asyncio.wait_for(reader.fetchval("SELECT count(*) FROM jobs"), 20) == 0

            async def gave_way() -> bool:
                return migrating.done() or any("retrying" in e["event"] for e in logs)

            await eventually(gave_way, what="the migration giving way to the reader")
            assert not migrating.done()  # it cannot finish while the reader holds job_runs
            await transaction.commit()
            applied = await asyncio.wait_for(migrating, 30)
        assert applied == [m.name for m in migrations() if m.version > 1]
        waits = [e for e in logs if "retrying" in e["event"]]
        assert waits[0]["migration"] == "0002_policies.sql"
        assert waits[0]["table"] == "job_runs"
        assert waits[0]["log_level"] == "warning"
    finally:
        await reader.close()
        await migrator.close()


async def test_a_migration_that_never_gets_its_lock_fails_naming_it_and_applies_nothing(
    schema_url: str,
) -> None:
    holder = await asyncpg.connect(schema_url)
    migrator = await asyncpg.connect(schema_url)
    try:
        await _migrated_through(migrator, 1)
        async with holder.transaction():
            await holder.execute("LOCK TABLE job_runs IN ACCESS SHARE MODE")
            with pytest.raises(
                MigrationLocked, match=r"0002_policies\.sql: could not lock job_runs"
            ):
                await migrate(migrator, patience=timedelta(seconds=1))
        versions = await migrator.fetch("SELECT version FROM claimd_migrations")
        assert [r["version"] for r in versions] == [1]  # rolled back whole
        assert await migrator.fetchval("SELECT to_regclass('job_run_gaps')") is None
        # The advisory lock was let go: once the reader is gone, the rest applies.
        assert len(await migrate(migrator)) == len(migrations()) - 1
    finally:
        await holder.close()
        await migrator.close()


async def test_every_migration_declares_the_locks_its_statements_take(schema_url: str) -> None:
    conn = await asyncpg.connect(schema_url)
    try:
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        strength = {mode.title().replace(" ", "") + "Lock": i for i, mode in enumerate(LOCK_MODES)}
        undeclared: dict[str, dict[str, str]] = {}
        for migration in migrations():
            before = {r["relname"] for r in await conn.fetch(TABLES)} - {"claimd_migrations"}
            declared = {table: LOCK_MODES.index(mode) for table, mode in migration.locks}
            assert set(declared) <= before, f"{migration.name} locks a table it creates"
            async with conn.transaction():
                await conn.execute(migration.path.read_text(encoding="utf-8"))
                held = await conn.fetch(HELD_ON_TABLES)
                await conn.execute(RECORD_MIGRATION, migration.version, migration.name)
            strongest: dict[str, str] = {}
            for row in held:
                table, mode = row["relname"], row["mode"]
                if strength[mode] > strength.get(strongest.get(table, ""), -1):
                    strongest[table] = mode
            for table, mode in strongest.items():
                if table in before and strength[mode] > declared.get(table, -1):
                    undeclared.setdefault(migration.name, {})[table] = mode
        assert undeclared == {}
    finally:
        await conn.close()

"""Numbered migrations from sql/, applied in order, recorded in a table.

A migration runs while other replicas and readers (a dashboard, `claimd
status`, the status page) use the tables it alters. Two rules keep it from
deadlocking them:

- **Its locks first, in one order.** Each file declares the table locks its
  statements take (``-- lock: job_runs IN SHARE MODE`` lines; a test holds
  every declaration to the locks its migration really takes), and they are
  all taken before its first statement, in :data:`LOCK_ORDER` (a job before
  its runs, the order the cascades and the writers take them in). The body
  then waits for no further table lock: a migration never holds an altered
  table while it waits for the next one.
- **A short lock_timeout, and retries.** A reader may still hold one of those
  tables and ask for one the migration already holds: a cycle whatever the
  order. The migration's lock waits are bounded by a lock_timeout below the
  server's deadlock_timeout, so the migration (the waiter that came first) is
  the one that gives up before PostgreSQL's deadlock check aborts anyone: it
  rolls back, letting the reader on, logs why, and tries again after a
  backoff, for up to ``patience``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import asyncpg

from actors.adapters.resources import sql_dir
from actors.clocks import Stopwatch
from actors.observability import get_logger
from actors.pacing import Backoff

log = get_logger("migrations")

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS claimd_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# Only migration takes the advisory lock: two replicas starting at once apply
# each migration once, and the lock is per schema.
LOCK_MIGRATIONS = "SELECT pg_advisory_lock(hashtext('claimd.migrate:' || current_schema()))"
UNLOCK_MIGRATIONS = "SELECT pg_advisory_unlock(hashtext('claimd.migrate:' || current_schema()))"
APPLIED_MIGRATIONS = "SELECT version FROM claimd_migrations"
RECORD_MIGRATION = "INSERT INTO claimd_migrations (version, name) VALUES ($1, $2)"
DEADLOCK_TIMEOUT = "SELECT extract(epoch FROM current_setting('deadlock_timeout')::interval)"
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', $1, true)"  # SET LOCAL

# The tables a migration may lock, in the order their locks are taken.
LOCK_ORDER = (
    "jobs",
    "job_runs",
    "job_run_attempts",
    "job_run_gaps",
    "operator_actions",
    "job_catalog_version",
    "config_rejected_jobs",
)
# PostgreSQL's table lock modes, weakest first.
LOCK_MODES = (
    "ACCESS SHARE",
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)
# The statements, written out from the two lists above (never from a file's text).
LOCK_TABLE = {
    (table, mode): f"LOCK TABLE {table} IN {mode} MODE"
    for table in LOCK_ORDER
    for mode in LOCK_MODES
}
# A lock wait of a migration lasts at most this, and at most half the server's
# deadlock_timeout (1 s unless set otherwise), so the migration gives up first.
LOCK_TIMEOUT = timedelta(milliseconds=500)
# How long a migration keeps trying to take its locks before it fails.
PATIENCE = timedelta(minutes=5)

_MIGRATION_NAME = re.compile(r"^(\d{4})_[\w-]+\.sql$")
_LOCK_LINE = re.compile(r"^--\s*lock:\s*(.*?)\s*$", re.MULTILINE)
_LOCK_CLAUSE = re.compile(r"^([a-z_]+) IN ([A-Z ]+?) MODE$")


class MigrationLocked(RuntimeError):
    """A migration could not take its locks within its patience: a long transaction holds them."""


@dataclass(frozen=True)
class Migration:
    """One file of sql/: its number, and the table locks it takes first."""

    version: int
    path: Path
    locks: tuple[tuple[str, str], ...]  # (table, mode), in LOCK_ORDER

    @property
    def name(self) -> str:
        return self.path.name


def read_locks(path: Path, text: str) -> tuple[tuple[str, str], ...]:
    """The ``-- lock: TABLE IN MODE MODE`` lines of a migration, in LOCK_ORDER."""
    locks: dict[str, str] = {}
    for clause in _LOCK_LINE.findall(text):
        match = _LOCK_CLAUSE.match(clause)
        if match is None or (match.group(1), match.group(2)) not in LOCK_TABLE:
            raise ValueError(
                f"{path.name}: '-- lock: {clause}' is not 'TABLE IN MODE MODE' with a table "
                f"of {', '.join(LOCK_ORDER)} and a PostgreSQL lock mode"
            )
        table, mode = match.groups()
        if table in locks:
            raise ValueError(f"{path.name}: {table} is locked twice")
        locks[table] = mode
    return tuple((t, locks[t]) for t in LOCK_ORDER if t in locks)


def migration_files(directory: Path | None = None) -> list[tuple[int, Path]]:
    """The numbered migrations in order."""
    directory = directory or sql_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _MIGRATION_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


def migrations(directory: Path | None = None) -> list[Migration]:
    """The numbered migrations in order, with their declared locks."""
    return [
        Migration(version, path, read_locks(path, path.read_text(encoding="utf-8")))
        for version, path in migration_files(directory)
    ]


async def migrate(
    conn: asyncpg.Connection,
    *,
    lock_timeout: timedelta = LOCK_TIMEOUT,
    patience: timedelta = PATIENCE,
) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    applied_now: list[str] = []
    await conn.execute(LOCK_MIGRATIONS)
    try:
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        applied = {r["version"] for r in await conn.fetch(APPLIED_MIGRATIONS)}
        deadlock_timeout = timedelta(seconds=float(await conn.fetchval(DEADLOCK_TIMEOUT)))
        wait = max(min(lock_timeout, deadlock_timeout / 2), timedelta(milliseconds=10))
        for migration in migrations():
            if migration.version in applied:
                continue
            await _apply(conn, migration, wait, patience)
            applied_now.append(migration.name)
    finally:
        await conn.execute(UNLOCK_MIGRATIONS)
    return applied_now


async def _apply(
    conn: asyncpg.Connection, migration: Migration, lock_timeout: timedelta, patience: timedelta
) -> None:
    """One migration in one transaction: its locks, its statements, its record; retried
    whole (after a rollback) while a lock wait outlasts ``lock_timeout``."""
    backoff = Backoff(initial=0.1, maximum=5.0)
    waiting = Stopwatch()
    tries = 0
    timeout_ms = f"{max(1, round(lock_timeout.total_seconds() * 1000))}ms"
    while True:
        tries += 1
        waiting_for: str | None = None
        try:
            async with conn.transaction():
                await conn.execute(SET_LOCK_TIMEOUT, timeout_ms)
                for table, mode in migration.locks:
                    waiting_for = table
                    await conn.execute(LOCK_TABLE[(table, mode)])
                waiting_for = None  # the body's own locks: none beyond these, unless undeclared
                # A migration may rewrite a big table: no statement timeout here.
                await conn.execute(migration.path.read_text(encoding="utf-8"), timeout=24 * 3600)
                await conn.execute(RECORD_MIGRATION, migration.version, migration.name)
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as exc:
            waited = waiting.seconds()
            where = waiting_for or "a table its statements lock"
            if waited >= patience.total_seconds():
                raise MigrationLocked(
                    f"migration {migration.name}: could not lock {where} in {round(waited)}s "
                    f"({tries} tries, each waiting at most {timeout_ms}); a transaction holds "
                    "it (see pg_stat_activity); try again once it ends"
                ) from exc
            delay = backoff.next_delay()
            # Said once per migration (then counted): a busy table can take many tries.
            (log.warning if tries == 1 else log.debug)(
                "migration waited too long for a lock; rolled back, letting the others on, "
                "and retrying",
                migration=migration.name,
                table=waiting_for,
                lock_timeout=timeout_ms,
                tries=tries,
                retry_in_s=round(delay, 3),
                error=str(exc),
            )
            await asyncio.sleep(delay)
            continue
        if tries > 1:
            log.warning(
                "migration applied after waiting for its locks",
                migration=migration.name,
                tries=tries,
                waited_s=round(waiting.seconds(), 3),
            )
        return

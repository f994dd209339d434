"""Numbered migrations from sql/, applied in order, recorded in a table."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

from actors.adapters.resources import sql_dir

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

_MIGRATION_NAME = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def migration_files(directory: Path | None = None) -> list[tuple[int, Path]]:
    """The numbered migrations in order."""
    directory = directory or sql_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _MIGRATION_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    applied_now: list[str] = []
    await conn.execute(LOCK_MIGRATIONS)
    try:
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        applied = {r["version"] for r in await conn.fetch(APPLIED_MIGRATIONS)}
        for version, path in migration_files():
            if version in applied:
                continue
            async with conn.transaction():
                # A migration may rewrite a big table: no statement timeout here.
                await conn.execute(path.read_text(encoding="utf-8"), timeout=24 * 3600)
                await conn.execute(RECORD_MIGRATION, version, path.name)
            applied_now.append(path.name)
    finally:
        await conn.execute(UNLOCK_MIGRATIONS)
    return applied_now

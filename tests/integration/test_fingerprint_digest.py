"""sql/0010: fingerprints stored as the definition's text become its digest; no job looks edited."""

from __future__ import annotations

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres.migrations import (
    CREATE_MIGRATIONS_TABLE,
    RECORD_MIGRATION,
    migration_files,
)
from actors.domain import CronSchedule, Job, ShellSpec
from actors.domain.jobs import canonical_definition
from tests.integration.helpers import make_job

pytestmark = pytest.mark.integration

DIGEST_MIGRATION = 10


async def _migrate_before_the_digest(schema_url: str) -> None:
    """The schema as a build before sql/0010 left it."""
    conn = await asyncpg.connect(schema_url)
    try:
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        for version, path in migration_files():
            if version >= DIGEST_MIGRATION:
                break
            await conn.execute(path.read_text(encoding="utf-8"))
            await conn.execute(RECORD_MIGRATION, version, path.name)
    finally:
        await conn.close()


async def test_rows_synced_before_the_digest_are_unchanged_for_the_new_sync(
    schema_url: str,
) -> None:
    await _migrate_before_the_digest(schema_url)
    jobs = [
        make_job("plain"),
        Job(
            name="accents",
            schedule=CronSchedule("0 2 * * *", "Europe/Berlin"),
            executor=ShellSpec(argv=("/bin/echo", "déjà vu", "日本"), env={"K": "ü"}),
        ),
    ]
    store = await PostgresRunStore.connect(schema_url, max_size=2)
    try:
        assert await store.sync_jobs(jobs) == {"plain": "added", "accents": "added"}
        # What the builds before sql/0010 stored: the canonical text itself.
        for job in jobs:
            await store.pool.execute(
                "UPDATE jobs SET fingerprint = $2 WHERE name = $1",
                job.name,
                canonical_definition(job),
            )
        assert "0010_fingerprint_digest.sql" in await store.migrate()
        stored = dict(await store.pool.fetch("SELECT name, fingerprint FROM jobs"))
        assert stored == {job.name: job.fingerprint() for job in jobs}
        assert all(len(f) == 64 for f in stored.values())
        assert await store.sync_jobs(jobs) == {}  # nothing looks edited
        # An edit is still an edit.
        edited = Job(name="plain", schedule=CronSchedule("5 4 * * *"), executor=jobs[0].executor)
        assert await store.sync_jobs([edited, jobs[1]]) == {"plain": "changed"}
    finally:
        await store.close()

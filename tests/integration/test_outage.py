"""A database that drops its connections is an outage (retry), not a crash (give up)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.ports import StoreUnavailable

pytestmark = pytest.mark.integration


async def test_a_connection_killed_mid_statement_is_store_unavailable_and_the_pool_recovers(
    store: PostgresRunStore, schema_url: str
) -> None:
    admin = await asyncpg.connect(schema_url)
    try:
        # Hold the claim statement in a lock wait, so that it is surely in flight
        # when the server kills its connection (as a restart or failover would).
        await admin.execute("BEGIN; LOCK TABLE job_runs IN ACCESS EXCLUSIVE MODE")
        claim = asyncio.create_task(store.claim_due_runs("me", 10, timedelta(minutes=1), 100))
        async with asyncio.timeout(10):
            while True:
                pid = await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%FROM job_runs%' AND pid <> pg_backend_pid()"
                )
                if pid:
                    break
                await asyncio.sleep(0.02)
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(StoreUnavailable):
            await claim
        await admin.execute("ROLLBACK")
    finally:
        await admin.close()
    # The pool replaces the dead connection: the next call goes through.
    assert await store.claim_due_runs("me", 10, timedelta(minutes=1), 100) == []


async def test_an_unreachable_database_is_an_outage() -> None:
    store = await PostgresRunStore.connect("postgresql://postgres@127.0.0.1:1/x", min_size=0)
    try:
        with pytest.raises(StoreUnavailable):
            await store.active_jobs()
    finally:
        await store.close()

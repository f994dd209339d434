"""A replica starting while another syncs many jobs waits for that sync, whatever it takes.

The sync lock is held for the whole of a sync's transaction: 100,000 new jobs
hold it for many seconds on a loaded machine, longer than one statement may
take. A replica that waited for it inside one statement failed its start on
the statement's deadline (seen in bench_burst at 100,000 jobs: "sync_jobs:
TimeoutError", the replica exited 1). Here another transaction holds the lock
for three times the waiting store's statement deadline.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from actors.adapters.postgres import PostgresRunStore
from actors.domain.lease import TimeoutBudget
from tests.integration.helpers import eventually, make_job

pytestmark = pytest.mark.integration

STATEMENT_S = 0.5
HOLD_SYNC_LOCK = "SELECT pg_advisory_xact_lock(hashtext('claimd.sync:' || current_schema()))"


async def test_a_sync_waits_for_another_sync_longer_than_a_statement_may_take(
    store: PostgresRunStore, schema_url: str
) -> None:
    budget = TimeoutBudget.from_settings(
        timedelta(seconds=30),
        timedelta(seconds=10),
        5,
        statement_timeout=timedelta(seconds=STATEMENT_S),
    )
    patient = await PostgresRunStore.connect(schema_url, max_size=2, timeouts=budget)
    try:
        async with store.pool.acquire() as holder, holder.transaction():
            await holder.execute(HOLD_SYNC_LOCK)  # "another replica's sync"
            with capture_logs() as logs:
                sync = asyncio.create_task(patient.sync_jobs([make_job("waits")]))

                async def waiting() -> bool:
                    return any("another replica is syncing" in e["event"] for e in logs)

                await eventually(waiting, what="the second sync says it waits")
                # The fault: the other sync goes on for three statement deadlines.
                await asyncio.sleep(3 * STATEMENT_S)
                assert not sync.done()
        changes = await asyncio.wait_for(sync, 10)
    finally:
        await patient.close()
    assert changes == {"waits": "added"}
    assert "waits" in await store.active_jobs()

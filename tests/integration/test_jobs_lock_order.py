"""Lock order on `jobs`: a reload and a materializer of two replicas never deadlock.

A reload (sync_jobs, one transaction) locks every job row it upserts, and the
materializer's high-water update locks the rows of the jobs it planned. Two
replicas whose config files (a rolling deploy) or plans list the jobs in
different orders would lock the same rows in different orders. The cycle is
forced, not waited for by luck: a third session holds every job row, both
statements queue behind it, and it lets go; each then holds its first row and
asks for the other's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import Plan
from tests.integration.helpers import eventually, make_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

LOCK_ALL_JOBS = "SELECT id FROM jobs ORDER BY id FOR UPDATE"
WAITING_FOR_A_LOCK = """
SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1::int[]) AND wait_event_type = 'Lock'
"""

Contender = Callable[[PostgresRunStore], Coroutine[Any, Any, object]]


@pytest.fixture
async def one_connection_stores(schema_url: str) -> AsyncIterator[list[PostgresRunStore]]:
    """Two stores of one connection each: each is one backend the test can watch."""
    stores = [await PostgresRunStore.connect(schema_url, min_size=1, max_size=1) for _ in range(2)]
    yield stores
    for s in stores:
        await s.close()


async def _race_behind_a_lock(
    schema_url: str, stores: list[PostgresRunStore], first: Contender, second: Contender
) -> list[BaseException | None]:
    """Queue both contenders behind a session holding every job row; then let go."""
    pids = [await s.pool.fetchval("SELECT pg_backend_pid()") for s in stores]
    holder = await asyncpg.connect(schema_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.fetch(LOCK_ALL_JOBS)
        tasks = [asyncio.create_task(first(stores[0])), asyncio.create_task(second(stores[1]))]

        async def both_waiting() -> bool:
            return await holder.fetchval(WAITING_FOR_A_LOCK, pids) == 2

        await eventually(both_waiting, what="both statements waiting for the job rows")
        await tx.commit()
    finally:
        await holder.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


async def test_two_reloads_listing_the_jobs_in_different_orders_do_not_deadlock(
    store: PostgresRunStore, schema_url: str, one_connection_stores: list[PostgresRunStore]
) -> None:
    a, b = make_job("a"), make_job("b")
    await store.sync_jobs([a, b])
    # Edited, so that each reload writes both rows (an unchanged job is not written).
    a2, b2 = make_job("a", max_attempts=4), make_job("b", max_attempts=4)
    a3, b3 = make_job("a", max_attempts=5), make_job("b", max_attempts=5)

    errors = await _race_behind_a_lock(
        schema_url,
        one_connection_stores,
        lambda s: s.sync_jobs([a2, b2]),
        lambda s: s.sync_jobs([b3, a3]),
    )
    assert errors == [None, None]


async def test_a_reload_and_a_materializer_do_not_deadlock(
    store: PostgresRunStore, schema_url: str, one_connection_stores: list[PostgresRunStore]
) -> None:
    a, b = make_job("a"), make_job("b")
    await store.sync_jobs([a, b])
    states = await store.active_jobs()
    now = await store.database_now()
    plans = [(states[name], Plan([], now + timedelta(minutes=1), 0)) for name in ("a", "b")]
    edited = [make_job("b", max_attempts=4), make_job("a", max_attempts=4)]

    errors = await _race_behind_a_lock(
        schema_url,
        one_connection_stores,
        lambda s: s.sync_jobs(edited),
        lambda s: s.materialize_many(plans),
    )
    assert errors == [None, None]


async def test_two_materializers_planning_in_different_orders_do_not_deadlock(
    store: PostgresRunStore, schema_url: str, one_connection_stores: list[PostgresRunStore]
) -> None:
    await store.sync_jobs([make_job(name) for name in ("a", "b", "c", "d")])
    states = await store.active_jobs()
    now = await store.database_now()
    plans = [(states[n], Plan([], now + timedelta(minutes=1), 0)) for n in ("a", "b", "c", "d")]

    errors = await _race_behind_a_lock(
        schema_url,
        one_connection_stores,
        lambda s: s.materialize_many(plans),
        lambda s: s.materialize_many(plans[::-1]),
    )
    assert errors == [None, None]

"""Definitions read once per fingerprint; never handed out with another version's fingerprint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres.statements import ACTIVE_JOBS
from actors.adapters.postgres.stored_definitions import DEFINITIONS_OF, StoredDefinitions
from actors.domain import CronSchedule
from tests.integration.helpers import make_job

pytestmark = pytest.mark.integration


class CountingPool:
    """The pool, counting the definition fetches."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.fetched: list[list[int]] = []

    async def fetch(self, query: str, *args: Any) -> Any:
        if query == DEFINITIONS_OF:
            self.fetched.append(sorted(args[0]))
        return await self.pool.fetch(query, *args)


async def test_a_definition_is_read_once_per_fingerprint(store: PostgresRunStore) -> None:
    a, b = make_job("a"), make_job("b")
    await store.sync_jobs([a, b])
    pool, cache = CountingPool(store.pool), StoredDefinitions()
    for _ in range(3):
        rows = await store.pool.fetch(ACTIVE_JOBS)
        got = await cache.of(pool, rows, every_job=True)
        assert set(got) == {r["id"] for r in rows}
    assert len(pool.fetched) == 1  # the first read only
    await store.sync_jobs([replace(b, schedule=CronSchedule("7 3 * * *", "UTC")), a])
    rows = await store.pool.fetch(ACTIVE_JOBS)
    got = await cache.of(pool, rows, every_job=True)
    b_id = next(r["id"] for r in rows if r["name"] == "b")
    assert pool.fetched[1:] == [[b_id]]  # only the changed one
    assert '"7 3 * * *"' in got[b_id]


async def test_a_reload_between_the_read_and_the_fetch_hands_out_no_mixed_version(
    store: PostgresRunStore,
) -> None:
    job = make_job("moving")
    await store.sync_jobs([job])
    cache = StoredDefinitions()
    rows = await store.pool.fetch(ACTIVE_JOBS)  # the old fingerprint...
    await store.sync_jobs([replace(job, schedule=CronSchedule("7 3 * * *", "UTC"))])
    # ...and the new definition: this read gets no definition for the job.
    assert await cache.of(store.pool, rows) == {}
    # The next read is consistent, from what the fetch kept.
    rows = await store.pool.fetch(ACTIVE_JOBS)
    [definition] = (await cache.of(store.pool, rows)).values()
    assert '"7 3 * * *"' in definition
    assert (await store.active_jobs())["moving"].definition == definition


async def test_jobs_with_one_definition_share_its_text_and_fingerprint(
    store: PostgresRunStore,
) -> None:
    await store.sync_jobs([make_job("a"), make_job("b"), make_job("c", max_attempts=5)])
    cache = StoredDefinitions()
    rows = await store.pool.fetch(ACTIVE_JOBS)
    got = await cache.of(store.pool, rows, every_job=True)
    ids = {r["name"]: r["id"] for r in rows}
    assert got[ids["a"]] is got[ids["b"]]
    assert got[ids["c"]] != got[ids["a"]]
    fingerprint = next(r["fingerprint"] for r in rows if r["name"] == "a")
    kept = cache.fingerprint("".join(fingerprint))  # an equal string, not the one kept
    assert kept == fingerprint
    assert cache.fingerprint("".join(fingerprint)) is kept
    states = await store.active_jobs()
    assert states["a"].fingerprint is states["b"].fingerprint

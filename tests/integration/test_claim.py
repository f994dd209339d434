"""The claimer's statement on real PostgreSQL: disjoint batches under a race, and the bound."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.adapters.postgres import CLAIM_DUE_RUNS, PostgresRunStore
from actors.domain import ClaimedRun
from actors.ports import DispatchMessage
from tests.integration.helpers import LONG_LEASE, add_job, insert_due_runs, make_job

pytestmark = pytest.mark.integration

RUNS = 10_000
CLAIMERS = 4


async def _claim_until_empty(
    store: PostgresRunStore, owner: str, batch: int, statement_only: bool
) -> list[ClaimedRun]:
    claimed: list[ClaimedRun] = []
    while True:
        if statement_only:
            # The claim statement alone: its row locks (FOR UPDATE SKIP LOCKED)
            # are what keeps racing batches disjoint.
            rows = await store.pool.fetch(CLAIM_DUE_RUNS, owner, batch, LONG_LEASE, timedelta(0))
            runs = [
                ClaimedRun(r["id"], r["name"], r["scheduled_at"], r["attempt"], r["claim_epoch"])
                for r in rows
            ]
        else:
            runs = await store.claim_due_runs(owner, batch, LONG_LEASE, max_claimed=1_000_000)
        if not runs:
            return claimed
        claimed.extend(runs)


@pytest.mark.parametrize("statement_only", [False, True], ids=["claim_due_runs", "statement"])
async def test_racing_claimers_get_disjoint_batches_covering_every_run(
    store: PostgresRunStore, schema_url: str, statement_only: bool
) -> None:
    job_id = await add_job(store, make_job())
    ids = set(await insert_due_runs(store, job_id, RUNS))
    assert len(ids) == RUNS

    stores = [await PostgresRunStore.connect(schema_url, max_size=2) for _ in range(CLAIMERS)]
    owners = [f"claimer-{i}" for i in range(CLAIMERS)]
    try:
        results = await asyncio.gather(
            *(
                _claim_until_empty(s, owner, 97, statement_only)
                for s, owner in zip(stores, owners, strict=True)
            )
        )
    finally:
        for s in stores:
            await s.close()

    per_owner = [[r.run_id for r in result] for result in results]
    everything = [run_id for got in per_owner for run_id in got]
    # Nothing claimed twice, across claimers or within one claimer's batches.
    assert len(everything) == len(set(everything)) == RUNS
    assert set(everything) == ids
    for i in range(CLAIMERS):
        for j in range(i + 1, CLAIMERS):
            assert not set(per_owner[i]) & set(per_owner[j])
    # The race was real: more than one claimer took a share.
    assert sum(1 for got in per_owner if got) >= 2
    assert all(r.epoch == 1 for result in results for r in result)

    rows = await store.pool.fetch(
        "SELECT id::text AS id, state, claim_epoch, lease_owner FROM job_runs"
    )
    assert len(rows) == RUNS
    assert {r["state"] for r in rows} == {"claimed"}
    assert {r["claim_epoch"] for r in rows} == {1}
    owner_of = {run_id: owners[i] for i, got in enumerate(per_owner) for run_id in got}
    assert all(r["lease_owner"] == owner_of[r["id"]] for r in rows)


async def _claimed_count(store: PostgresRunStore) -> int:
    return int(await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'claimed'"))


async def test_claims_stop_at_the_in_flight_bound(store: PostgresRunStore) -> None:
    bound = 25
    job_id = await add_job(store, make_job())
    await insert_due_runs(store, job_id, 100)

    total: list[ClaimedRun] = []
    for _ in range(20):
        total += await store.claim_due_runs("me", 7, LONG_LEASE, max_claimed=bound)
        assert await _claimed_count(store) <= bound
    assert len(total) == bound
    assert await _claimed_count(store) == bound
    assert await store.claim_due_runs("me", 7, LONG_LEASE, max_claimed=bound) == []

    # Only claimed-but-not-started runs count: starting 10 makes room for 10 more.
    messages = [
        DispatchMessage(r.run_id, r.epoch, r.job, r.scheduled_at, r.attempt, "d")
        for r in total[:10]
    ]
    started, not_started = await store.start_runs("worker", messages, LONG_LEASE)
    assert len(started) == 10
    assert not_started == []
    more: list[ClaimedRun] = []
    for _ in range(5):
        more += await store.claim_due_runs("me", 7, LONG_LEASE, max_claimed=bound)
        assert await _claimed_count(store) <= bound
    assert len(more) == 10
    assert await _claimed_count(store) == bound


async def test_concurrent_claimers_overshoot_the_bound_by_at_most_one_batch_each(
    store: PostgresRunStore, schema_url: str
) -> None:
    bound = 40
    job_id = await add_job(store, make_job())
    await insert_due_runs(store, job_id, 2_000)
    stores = [await PostgresRunStore.connect(schema_url, max_size=1) for _ in range(CLAIMERS)]

    async def claim_rounds(s: PostgresRunStore, owner: str) -> int:
        got = 0
        for _ in range(10):
            got += len(await s.claim_due_runs(owner, 30, timedelta(minutes=5), max_claimed=bound))
        return got

    try:
        for _ in range(5):
            got = await asyncio.gather(*(claim_rounds(s, f"c{i}") for i, s in enumerate(stores)))
            # Racing claimers may each see the same room: the documented
            # overshoot is at most (claimers - 1) x batch, never unbounded.
            assert await _claimed_count(store) <= bound + (CLAIMERS - 1) * 30, got
            # Start everything claimed so the next round has room again.
            await store.pool.execute(
                "UPDATE job_runs SET state = 'running' WHERE state = 'claimed'"
            )
    finally:
        for s in stores:
            await s.close()

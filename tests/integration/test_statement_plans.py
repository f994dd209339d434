"""The worker's batch statements cost one primary-key probe per run, whatever the statistics say.

A backlog claimed since the last ANALYZE is what a drain after an outage
looks like: the statistics say no run is claimed or running. With a guard on
``r.state`` in its UPDATE, START_RUNS (and the heartbeat, the completion and
the release) let the planner drive the update from the partial index of
claimed and running rows and compare each of those rows with each run of the
batch: 256 x 1,000 comparisons here, 256 x 16,000 in a 20,000-run drain, which
started 256 runs per 1.4 s. The plans are read with EXPLAIN ANALYZE of the
store's own calls (in a transaction rolled back, then the call itself), and
the rows a join filter threw away are counted: a probe by id throws none away.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres.statements.claim import RELEASE_UNPUBLISHED
from actors.adapters.postgres.statements.worker import COMPLETE_RUNS, EXTEND_LEASES, START_RUNS
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion
from tests.integration.helpers import LONG_LEASE, add_job, insert_due_runs, make_job, message_for

pytestmark = pytest.mark.integration

BACKLOG = 4000
CLAIMED = 2000
BATCH = 256
WATCHED = {
    START_RUNS: "start",
    EXTEND_LEASES: "extend",
    COMPLETE_RUNS: "complete",
    RELEASE_UNPUBLISHED: "release",
}


class ExplainingPool:
    """The store's pool, which first EXPLAIN ANALYZEs the watched statements (rolled back)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.plans: dict[str, Any] = {}
        self.watching = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> list[asyncpg.Record]:
        if self.watching and query in WATCHED:
            async with self._pool.acquire() as conn:
                tx = conn.transaction()
                await tx.start()
                try:
                    plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query, *args)
                finally:
                    await tx.rollback()
            self.plans[WATCHED[query]] = json.loads(plan)[0]["Plan"]
        return await self._pool.fetch(query, *args, **kwargs)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def thrown_away(plan: dict[str, Any]) -> int:
    """Rows that joins compared and discarded, over the whole plan."""
    return sum(int(n.get("Rows Removed by Join Filter", 0)) for n in _nodes(plan))


def read_by_index(plan: dict[str, Any]) -> int:
    """Rows of job_runs that index scans produced, over the whole plan (rows x loops)."""
    return sum(
        int(n["Actual Rows"]) * int(n["Actual Loops"])
        for n in _nodes(plan)
        if n.get("Relation Name") == "job_runs" and "Index" in n["Node Type"]
    )


async def test_batch_statements_probe_by_id_when_the_statistics_say_nothing_is_claimed(
    store: PostgresRunStore, deployment: str
) -> None:
    job_id = await add_job(store, make_job("drain"))
    await insert_due_runs(store, job_id, BACKLOG)
    async with store.pool.acquire() as conn:
        await conn.execute("ANALYZE job_runs")  # every run pending, as seen by the planner
    claimed = await store.claim_due_runs("replica-a", CLAIMED, LONG_LEASE, CLAIMED)
    assert len(claimed) == CLAIMED

    explaining = ExplainingPool(store._pool)
    store._pool = explaining
    try:
        started, refused = await store.start_runs(
            "worker-a", [message_for(r, deployment) for r in claimed[:BATCH]], LONG_LEASE
        )
        assert (len(started), refused) == (BATCH, [])
        explaining.watching = False  # more running rows for the heartbeat and completion
        more, _ = await store.start_runs(
            "worker-a", [message_for(r, deployment) for r in claimed[BATCH : 4 * BATCH]], LONG_LEASE
        )
        assert len(more) == 3 * BATCH
        explaining.watching = True
        running = [(s.run_id, s.epoch) for s in started]
        assert await store.extend_leases("worker-a", running, LONG_LEASE) == set(running)
        done = [
            Completion(run_id, epoch, ExecutionResult(Outcome.SUCCEEDED), None, "worker-a")
            for run_id, epoch in running
        ]
        assert await store.complete_runs(done) == set(running)
        unpublished = claimed[4 * BATCH : 5 * BATCH]
        assert await store.release_unpublished("replica-a", unpublished) == BATCH
    finally:
        store._pool = explaining._pool

    assert set(explaining.plans) == set(WATCHED.values())
    # Each run of the batch found by its id: nothing compared and thrown away,
    # no more rows read than the batch's (the lock and the update each read
    # them once). Driven from the partial index of active runs, the start read
    # every claimed run (2,000) and, in a nested loop, threw away 255,744.
    figures = {
        name: (thrown_away(plan), read_by_index(plan) <= 2 * BATCH)
        for name, plan in explaining.plans.items()
    }
    assert figures == {name: (0, True) for name in figures}, json.dumps(explaining.plans)[:3000]

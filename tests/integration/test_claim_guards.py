"""The claim statements' guards, each shown by what goes wrong without it, on PostgreSQL.

- SKIP LOCKED: a claim never waits for a row another transaction holds; it
  takes the other due runs. (Racing claimers get disjoint batches without it
  too, by waiting: tests/integration/test_claim.py cannot tell the difference.)
- ORDER BY inside the locking select: the oldest due runs go first even when
  the planner reads the table in another order (a sequential scan over a big
  backlog inserted newest first).
- "No active run" in the exclusive claim: a forbid/queue job that is busy, with
  due runs waiting, is passed over; without it the claim statement of every
  forbid/queue job fails on the overlap index, and one busy job starves the rest.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import CronSchedule, Job, Overlap, PythonSpec
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    add_job,
    insert_due_runs,
    make_job,
    message_for,
)

pytestmark = pytest.mark.integration

# A claim that waits for a lock fails after this, instead of hanging the test.
LOCK_TIMEOUT_S = 3


def _with_settings(url: str, **settings: str) -> str:
    """``url`` whose connections start with these server settings (asyncpg passes
    unknown query parameters to the server)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in settings]
    query += list(settings.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture
async def impatient(schema_url: str) -> AsyncIterator[PostgresRunStore]:
    """A second store on the test's schema whose statements give up waiting for a lock."""
    store = await PostgresRunStore.connect(
        _with_settings(schema_url, lock_timeout=f"{LOCK_TIMEOUT_S}s"), max_size=2
    )
    yield store
    await store.close()


def _job(name: str, overlap: Overlap) -> Job:
    return Job(
        name=name,
        schedule=CronSchedule(RARE_CRON, "UTC"),
        executor=PythonSpec("tests.integration.helpers:record_call"),
        overlap=overlap,
    )


async def _add_jobs(store: PostgresRunStore, *jobs: Job) -> list[int]:
    """The jobs' rows, in one sync (a sync disables the jobs it is not given)."""
    await store.sync_jobs(list(jobs))
    active = await store.active_jobs()
    return [active[job.name].id for job in jobs]


async def _hold_row_lock(schema_url: str, run_id: str) -> asyncpg.Connection:
    """A connection in a transaction holding ``run_id``'s row lock (as a completion,
    a release or the skip pass does while it works); roll it back to let go."""
    conn = await asyncpg.connect(schema_url)
    await conn.execute("BEGIN")
    locked = await conn.fetchval(
        "SELECT id::text FROM job_runs WHERE id = $1 FOR NO KEY UPDATE", run_id
    )
    assert locked == run_id
    return conn


@pytest.mark.parametrize("overlap", [Overlap.ALLOW, Overlap.QUEUE], ids=["due", "exclusive"])
async def test_a_claim_passes_over_a_locked_run_without_waiting(
    store: PostgresRunStore, impatient: PostgresRunStore, schema_url: str, overlap: Overlap
) -> None:
    if overlap is Overlap.ALLOW:
        job_id = await add_job(store, _job("many", overlap))
        runs = await insert_due_runs(store, job_id, 5)
    else:
        # One due run per exclusive job: the exclusive claim nominates each job's next.
        runs = []
        for job_id in await _add_jobs(store, *(_job(f"one-{i}", overlap) for i in range(5))):
            runs += await insert_due_runs(store, job_id, 1)
    oldest, *others = runs
    holder = await _hold_row_lock(schema_url, oldest)
    try:
        began = time.monotonic()
        # LockNotAvailableError after LOCK_TIMEOUT_S if the claim waits for the lock.
        claimed = await impatient.claim_due_runs("claimer", 10, LONG_LEASE, max_claimed=100)
        waited = time.monotonic() - began
        state = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", oldest)
    finally:
        await holder.execute("ROLLBACK")
        await holder.close()
    assert sorted(r.run_id for r in claimed) == sorted(others)
    assert state == "pending"  # the locked run was passed over, not claimed
    assert waited < LOCK_TIMEOUT_S
    # Once the lock is gone, the next claim takes it.
    [later] = await impatient.claim_due_runs("claimer", 10, LONG_LEASE, max_claimed=100)
    assert later.run_id == oldest


# Many due runs, inserted newest first: a sequential scan meets the newest first.
BACKLOG = 5_000
INSERT_NEWEST_FIRST = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT $1, t, t
  FROM generate_series(1, $2::int) AS g,
       LATERAL (SELECT now() - interval '1 minute' + ($2 - g) * interval '1 ms') AS i(t)
"""


@pytest.mark.parametrize(
    "planner",
    [{}, {"enable_indexscan": "off", "enable_bitmapscan": "off"}],
    ids=["analyzed", "no-index-scans"],
)
async def test_a_small_claim_takes_the_oldest_due_runs_of_a_big_backlog(
    store: PostgresRunStore, schema_url: str, planner: dict[str, str]
) -> None:
    job_id = await add_job(store, make_job())
    await store.pool.execute(INSERT_NEWEST_FIRST, job_id, BACKLOG)
    await store.pool.execute("ANALYZE job_runs")
    oldest = [
        r["id"]
        for r in await store.pool.fetch(
            "SELECT id::text FROM job_runs ORDER BY due_at LIMIT 20", timeout=10
        )
    ]
    # Without an index scan in due order (the planner's choice when most of the
    # table is due, forced here in one variant), only the ORDER BY puts the
    # oldest first; the LIMIT then cuts the right rows.
    claimer = await PostgresRunStore.connect(_with_settings(schema_url, **planner), max_size=1)
    try:
        for name, value in planner.items():
            assert await claimer.pool.fetchval(f"SHOW {name}") == value
        first = await claimer.claim_due_runs("claimer", 10, LONG_LEASE, max_claimed=100_000)
        second = await claimer.claim_due_runs("claimer", 10, LONG_LEASE, max_claimed=100_000)
    finally:
        await claimer.close()
    assert sorted(r.run_id for r in first) == sorted(oldest[:10])
    assert sorted(r.run_id for r in second) == sorted(oldest[10:20])


async def test_one_busy_queue_job_does_not_starve_the_other_exclusive_jobs(
    store: PostgresRunStore,
) -> None:
    busy, queued, forbidden = await _add_jobs(
        store,
        _job("busy", Overlap.QUEUE),
        _job("queued", Overlap.QUEUE),
        _job("forbidden", Overlap.FORBID),
    )
    waiting = await insert_due_runs(store, busy, 3)
    [running] = await store.claim_due_runs("replica", 10, LONG_LEASE, max_claimed=100)
    assert running.run_id == waiting[0]
    started, _ = await store.start_runs("worker", [message_for(running, "d")], LONG_LEASE)
    assert [s.run_id for s in started] == [running.run_id]

    # Other exclusive jobs with a due run each, while the busy one has two waiting.
    others = [
        run_id
        for job_id in (queued, forbidden)
        for run_id in await insert_due_runs(store, job_id, 1)
    ]

    assert len(others) == 2
    claimed = await store.claim_due_runs("replica", 10, LONG_LEASE, max_claimed=100)
    assert sorted(r.run_id for r in claimed) == sorted(others)
    states = dict(
        await store.pool.fetch(
            "SELECT id::text, state FROM job_runs WHERE id = ANY($1::uuid[])", waiting
        )
    )
    assert states == {waiting[0]: "running", waiting[1]: "pending", waiting[2]: "pending"}
    # The busy job's next run waits for the running one, not for a lucky claim.
    assert await store.claim_due_runs("replica", 10, LONG_LEASE, max_claimed=100) == []


async def test_the_impatient_store_gives_up_waiting_for_locks(
    impatient: PostgresRunStore,
) -> None:
    # The setting reaches the server: a claim that waits fails instead of hanging.
    assert await impatient.pool.fetchval("SHOW lock_timeout") == f"{LOCK_TIMEOUT_S}s"

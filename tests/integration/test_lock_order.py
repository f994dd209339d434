"""Lock order: heartbeats, starts and completions of the same rows never deadlock.

Many concurrent callers extend, start again and complete overlapping sets of
one worker's running rows, each set in a shuffled order, as the worker's
heartbeat (in-flight order) and completion batches (finish order) do. If any
two statements locked shared rows in different orders, PostgreSQL would find
a cycle and abort one: the test counts both what the callers saw and
``pg_stat_database.deadlocks``.

The test runs in a database of its own: the deadlock counter is per database,
and other tests (or other people's) on a shared one must not move it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion, DispatchMessage, StoreUnavailable
from tests import servers
from tests.integration.helpers import add_job, make_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKER = "worker-1"
ROWS = 240
ROUNDS = 12
HEARTBEATERS = 4
STARTERS = 2
COMPLETERS = 2
CALLS_PER_ROUND = 6
LEASE = timedelta(minutes=5)


def _in_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture
async def private_database(database_url: str) -> AsyncIterator[tuple[str, str]]:
    """(url, name) of a fresh database, dropped afterwards."""
    name = servers.unique_name("claimd_locks_")
    admin = await asyncpg.connect(database_url)
    try:
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.InsufficientPrivilegeError:
            pytest.skip(
                "needs CREATEDB: the deadlock counter is per database, so the test makes its own"
            )
        # Only to find cycles sooner on a build that has them: a lock wait
        # shorter than this is never checked, so it changes nothing else.
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await admin.execute(f"ALTER DATABASE \"{name}\" SET deadlock_timeout = '100ms'")
    finally:
        await admin.close()
    yield _in_database(database_url, name), name
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _deadlocks_once_flushed(admin: asyncpg.Connection, name: str) -> int:
    """The database's deadlock counter, read once every backend of it has exited.

    A backend sends its statistics when it exits (and only from time to time
    before), so waiting for all of them to be gone is what makes the figure final.
    """
    deadline = time.monotonic() + 60
    while await admin.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = $1 AND backend_type = 'client backend'",
        name,
    ):
        if time.monotonic() > deadline:
            raise AssertionError(f"backends of {name} still alive after 60 s")
        await asyncio.sleep(0.05)
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await admin.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = $1", name) or 0
    )


async def _runs(store: PostgresRunStore) -> list[str]:
    job_id = await add_job(store, make_job("stress"))
    rows = await store.pool.fetch(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at)"
        " SELECT $1, now() - g * interval '1 ms', now() FROM generate_series(1, $2::int) g"
        " RETURNING id::text",
        job_id,
        ROWS,
    )
    return [r["id"] for r in rows]


RESET = """
UPDATE job_runs SET state = 'running', claim_epoch = $3, lease_owner = $2,
       lease_expires_at = now() + interval '5 minutes', started_at = now(),
       finished_at = NULL, outcome = NULL, attempt = 1
 WHERE id = ANY($1::uuid[])
"""


async def _round(
    store: PostgresRunStore,
    ids: list[str],
    epoch: int,
    rng: random.Random,
    errors: list[BaseException],
) -> None:
    now = datetime.now(UTC)
    messages = {i: DispatchMessage(i, epoch, "stress", now, 1, "d") for i in ids}
    # The completers share the rows between them; heartbeats and starts pick
    # large overlapping subsets. Every list is in its own random order.
    halves = [ids[k::COMPLETERS] for k in range(COMPLETERS)]

    async def guarded(call: Awaitable[object]) -> None:
        try:
            await call
        except StoreUnavailable as exc:  # a deadlock is reported as a transient error
            errors.append(exc)

    async def heartbeat() -> None:
        for _ in range(CALLS_PER_ROUND):
            some = rng.sample(ids, len(ids) * 2 // 3)
            await guarded(store.extend_leases(WORKER, [(i, epoch) for i in some], LEASE))

    async def start_again() -> None:
        for _ in range(CALLS_PER_ROUND):
            some = rng.sample(ids, len(ids) // 2)
            # Taken up again (as after a lost start reply), so the rows are updated.
            await guarded(
                store.start_runs(
                    WORKER, [messages[i] for i in some], LEASE, retake={(i, epoch) for i in some}
                )
            )

    async def complete(mine: list[str]) -> None:
        rng.shuffle(mine)
        chunk = max(1, len(mine) // CALLS_PER_ROUND)
        for k in range(0, len(mine), chunk):
            await guarded(
                store.complete_runs(
                    [
                        Completion(i, epoch, ExecutionResult(Outcome.SUCCEEDED), None, WORKER)
                        for i in mine[k : k + chunk]
                    ]
                )
            )

    await asyncio.gather(
        *(heartbeat() for _ in range(HEARTBEATERS)),
        *(start_again() for _ in range(STARTERS)),
        *(complete(list(h)) for h in halves),
    )


async def test_heartbeats_starts_and_completions_of_shared_rows_never_deadlock(
    private_database: tuple[str, str], database_url: str
) -> None:
    url, name = private_database
    admin = await asyncpg.connect(database_url)
    try:
        setup = await PostgresRunStore.connect(url, max_size=2)
        await setup.migrate()
        ids = await _runs(setup)
        await setup.close()
        before = await _deadlocks_once_flushed(admin, name)

        store = await PostgresRunStore.connect(
            url,
            min_size=HEARTBEATERS + STARTERS + COMPLETERS,
            max_size=HEARTBEATERS + STARTERS + COMPLETERS,
        )
        rng = random.Random(7)
        errors: list[BaseException] = []
        completed = 0
        try:
            for epoch in range(1, ROUNDS + 1):
                # Each round is a new claim of every row: a fresh epoch.
                await store.pool.execute(RESET, ids, WORKER, epoch)
                await _round(store, ids, epoch, rng, errors)
                completed += await store.pool.fetchval(
                    "SELECT count(*) FROM job_runs WHERE id = ANY($1::uuid[])"
                    " AND state = 'succeeded'",
                    ids,
                )
        finally:
            await store.close()
        after = await _deadlocks_once_flushed(admin, name)
    finally:
        await admin.close()

    print(
        f"deadlocks: {after - before}; errors seen by callers: {len(errors)};"
        f" runs completed: {completed} of {ROUNDS * ROWS}"
    )
    assert [e for e in errors if "eadlock" in str(e)] == []
    assert after - before == 0
    assert errors == []
    # Every completion went through despite the concurrent heartbeats and starts.
    assert completed == ROUNDS * ROWS

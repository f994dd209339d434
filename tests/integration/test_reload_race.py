"""Reloads of two replicas racing, each reading a different file (issue 18, a reload storm).

One replica's reload adds a job back, the other's removes it a moment later,
before any materializer tick planned the instant due in between. That
instant came due while the job was in the config: it must have a row (here
cancelled "job removed from config", since the removal came before any
start), never no row and no recorded reason. No materializer runs here, so
the interleaving is the one a storm produces by chance: a removal after the
re-add's instant and before the next tick.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import load_config
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.replica.reload import JobsConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

JOB = '[jobs.{name}]\nevery = "1s"\nrun = {{ shell = ["true"] }}\n\n'
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def replica_config(path: Path, schema_url: str, nats_url: str, jobs: list[str]) -> JobsConfig:
    """A scheduler replica's config, read from a file of its own."""
    path.write_text(
        f'[claimd]\ndatabase_url = "{schema_url}"\nnats_url = "{nats_url}"\nhttp = "off"\n\n'
        + "".join(JOB.format(name=name) for name in jobs)
    )
    return JobsConfig(path, load_config(path, env={}), syncs_jobs=True)


async def db_now(store: PostgresRunStore) -> datetime:
    now: datetime = await store.pool.fetchval("SELECT clock_timestamp()")
    return now


async def past_an_instant(store: PostgresRunStore) -> datetime:
    """Wait (polling the database's clock) until the next whole second has passed; return it."""
    now = await db_now(store)
    instant = EPOCH + timedelta(seconds=int((now - EPOCH).total_seconds()) + 1)
    deadline = time.monotonic() + 5
    while await db_now(store) <= instant:
        assert time.monotonic() < deadline, "the database's clock did not pass a second"
        await asyncio.sleep(0.02)
    return instant


async def rows_of(store: PostgresRunStore, after: datetime) -> dict[datetime, tuple[str, str]]:
    rows = await store.pool.fetch(
        "SELECT r.scheduled_at, r.state, r.error FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = 'flicker' AND r.scheduled_at > $1",
        after,
    )
    return {r["scheduled_at"]: (r["state"], r["error"]) for r in rows}


async def test_an_instant_due_between_a_re_add_and_a_removal_has_its_row(
    tmp_path: Path, schema_url: str, nats_url: str, store: PostgresRunStore
) -> None:
    full = replica_config(tmp_path / "a.toml", schema_url, nats_url, ["steady", "flicker"])
    short = replica_config(tmp_path / "b.toml", schema_url, nats_url, ["steady"])
    await full.sync_at_start(store, "replica-a")
    added = await db_now(store)

    # Added, then removed by the other replica after an instant and before any tick.
    first = await past_an_instant(store)
    assert await short.reload(store, "replica-b") is True
    removed = await db_now(store)
    cancelled = ("cancelled", REMOVED_FROM_CONFIG)
    assert (await rows_of(store, added)).get(first) == cancelled

    # Out of the config for a second or more: none of those instants gets a row.
    await past_an_instant(store)
    # Forced: the file A had before is superseded, and only an operator's rollback
    # (claimd reload --force) applies it again (docs/rollout.md).
    assert await full.reload(store, "replica-a", force=True) is True
    back = await db_now(store)
    assert [t for t in await rows_of(store, removed) if t <= back] == []

    # Back, and removed again by replica B before a tick: the instant between has its row.
    second = await past_an_instant(store)
    assert await short.reload(store, "replica-b", force=True) is True
    again = await rows_of(store, back)
    assert again.get(second) == cancelled, again
    assert all(state == cancelled for state in again.values()), again

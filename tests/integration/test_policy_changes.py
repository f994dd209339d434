"""Changing or removing a job while its runs are in flight leaves nothing stuck."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import Overlap
from actors.scheduling.reaper import Reaper
from tests.integration.helpers import add_job, insert_due_runs, make_job, message_for

pytestmark = pytest.mark.integration
LEASE = timedelta(minutes=5)


async def test_runs_left_exclusive_by_a_queue_job_claim_fine_once_it_allows_overlap(
    store: PostgresRunStore,
) -> None:
    job = replace(make_job(), overlap=Overlap.QUEUE)
    job_id = await add_job(store, job)
    await insert_due_runs(store, job_id, 2)
    # Both were claimed as exclusive at some point and came back to pending
    # (a retry, a reaped lease): the flag stays on the rows.
    await store.pool.execute("UPDATE job_runs SET exclusive = true")
    await store.sync_jobs([replace(job, overlap=Overlap.ALLOW)])
    claimed = await store.claim_due_runs("me", 10, LEASE, 100)
    assert len(claimed) == 2
    assert (
        await store.pool.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'claimed' AND NOT exclusive"
        )
        == 2
    )


async def test_runs_of_a_removed_job_are_cancelled_even_if_they_come_back_later(
    store: PostgresRunStore,
) -> None:
    import asyncio

    job_id = await add_job(store, make_job())
    ids = await insert_due_runs(store, job_id, 3)
    claimed = await store.claim_due_runs("me", 2, LEASE, 100)
    assert len(claimed) == 2
    [begun], _ = await store.start_runs("worker", [message_for(claimed[0], "d")], LEASE)
    await store.sync_jobs([])  # the job is removed from the config
    states = dict(await store.pool.fetch("SELECT id::text, state FROM job_runs"))
    # Pending and claimed-not-started are cancelled; the running one finishes.
    assert sorted(states.values()) == ["cancelled", "cancelled", "running"]
    assert states[begun.run_id] == "running"
    # The claimed one cannot come back to pending (its publish failed, say).
    assert await store.release_unpublished("me", claimed[1:]) == 0
    # The running one does come back, its lease expired on an attempt left:
    # the reaper returns it to pending, and its next pass cancels it rather
    # than leave it pending for ever.
    await store.pool.execute(
        "UPDATE job_runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        begun.run_id,
    )
    reaper = Reaper(store, timedelta(seconds=1), asyncio.Event())
    await reaper.reap_once()
    assert (
        await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", begun.run_id)
        == "pending"
    )
    await reaper.reap_once()
    states = dict(await store.pool.fetch("SELECT id::text, state FROM job_runs"))
    assert states == dict.fromkeys(ids, "cancelled")

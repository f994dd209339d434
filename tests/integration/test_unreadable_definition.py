"""A job definition this worker cannot read fails its own attempt, not the whole batch."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from tests.integration.helpers import (
    consumer_counts,
    eventually,
    insert_due_runs,
    jetstream_worker,
    make_job,
    message_for,
)

pytestmark = pytest.mark.integration


async def test_unreadable_definition_fails_that_run_and_the_others_run(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> None:
    await store.sync_jobs([make_job("good"), make_job("odd", max_attempts=1)])
    ids = {name: state.id for name, state in (await store.active_jobs()).items()}
    good_id, odd_id = ids["good"], ids["odd"]
    # As if a newer build had stored an executor kind this one does not know.
    await store.pool.execute(
        "UPDATE jobs SET definition = jsonb_set(definition, '{executor,kind}', '\"teleport\"')"
        " WHERE id = $1",
        odd_id,
    )
    good = await insert_due_runs(store, good_id, 3)
    (odd,) = await insert_due_runs(store, odd_id, 1)
    claimed = await store.claim_due_runs("c", 10, timedelta(minutes=5), 100)
    assert await broker.publish_many([message_for(r, deployment) for r in claimed]) == [None] * 4

    stop = asyncio.Event()
    worker = await jetstream_worker(
        store,
        broker,
        deployment,
        stop,
        concurrency=8,
        heartbeat=timedelta(seconds=1),
    )
    task = asyncio.create_task(worker.run())
    try:

        async def settled() -> bool:
            states = dict(await store.pool.fetch("SELECT id::text, state FROM job_runs"))
            return all(states[i] == "succeeded" for i in good) and states[odd] == "failed"

        await eventually(settled)

        async def acked() -> bool:
            return await consumer_counts(broker) == (0, 0)

        await eventually(acked)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    error = await store.pool.fetchval("SELECT error FROM job_runs WHERE id = $1::uuid", odd)
    assert "definition unreadable" in error
    assert "teleport" in error

"""A completion the database refuses does not block the others, nor the worker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from actors.adapters.executors import LocalExecutor
from actors.adapters.nats import JetStreamBroker, decode, delivery_count
from actors.adapters.postgres import PostgresRunStore
from actors.ports import Completion, RecordRejected
from actors.worker import Worker
from tests.integration.helpers import (
    add_job,
    consumer_counts,
    counter,
    eventually,
    insert_due_runs,
    make_job,
    message_for,
)

pytestmark = pytest.mark.integration


class RefusesOneRun(PostgresRunStore):
    """The real store, except that any batch holding ``bad`` is refused as data."""

    bad = ""

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        if any(c.run_id == self.bad for c in completions):
            raise RecordRejected("refused for the test")
        return await super().complete_runs(completions)


async def test_a_rejected_completion_is_abandoned_to_the_lease_and_the_rest_recorded(
        store: PostgresRunStore, broker: JetStreamBroker, deployment: str) -> None:
    job_id = await add_job(store, make_job())
    ids = await insert_due_runs(store, job_id, 6)
    claimed = await store.claim_due_runs("c", 10, timedelta(minutes=5), 100)
    assert len(claimed) == 6
    assert await broker.publish_many([message_for(r, deployment) for r in claimed]) == [None] * 6

    refusing = RefusesOneRun(store.pool)
    refusing.bad = ids[0]
    rejected_before = counter("claimd_completions_rejected_total")
    stop = asyncio.Event()
    worker = Worker(refusing, await broker.pull_subscription(), LocalExecutor(),
                    worker_id="w", deployment=deployment, lease=timedelta(seconds=30),
                    heartbeat_interval=timedelta(milliseconds=200), concurrency=16,
                    decode=decode, delivery_count=delivery_count, stop=stop,
                    grace=timedelta(seconds=5))
    task = asyncio.create_task(worker.run())
    try:
        async def five_recorded() -> bool:
            return await store.pool.fetchval(
                "SELECT count(*) FROM job_runs WHERE state = 'succeeded'") == 5
        await eventually(five_recorded)
        # The refused run is no longer heartbeated: nothing of it stays in flight.
        async def forgotten() -> bool:
            return not worker.in_flight
        await eventually(forgotten)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert counter("claimd_completions_rejected_total") == rejected_before + 1
    row = await store.pool.fetchrow(
        "SELECT state, lease_expires_at > now() AS live FROM job_runs WHERE id = $1::uuid",
        ids[0])
    # Still running under a lease nobody extends: the reaper will take it back.
    assert row["state"] == "running"
    pending, _ = await consumer_counts(broker)
    assert pending == 0

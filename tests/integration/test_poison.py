"""Poison messages on the dispatch subject: counted, logged, settled; the worker goes on."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from actors.adapters.nats import CONSUMER, MAX_MESSAGE_BYTES, JetStreamBroker, encode
from actors.adapters.postgres import PostgresRunStore
from actors.domain import CronSchedule, Job, PythonSpec
from actors.ports import DispatchMessage
from tests.integration.helpers import jetstream_worker

pytestmark = pytest.mark.integration


def poison_count(reason: str) -> float:
    return REGISTRY.get_sample_value("claimd_poison_messages_total", {"reason": reason}) or 0.0


def skipped_count(reason: str) -> float:
    return REGISTRY.get_sample_value("claimd_deliveries_skipped_total", {"reason": reason}) or 0.0


def dispatch(deployment: str, run_id: str | None = None, epoch: int = 1) -> DispatchMessage:
    return DispatchMessage(
        run_id=run_id or str(uuid.uuid4()),
        epoch=epoch,
        job="j",
        scheduled_at=datetime.now(UTC),
        attempt=1,
        deployment=deployment,
    )


async def test_poison_messages_are_settled_and_counted_and_the_worker_goes_on(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> None:
    # A real, runnable run published after the poison: the worker must still reach it.
    job = Job(
        name="ok",
        schedule=CronSchedule("0 0 1 1 *"),
        executor=PythonSpec("actors.config.examples:hello"),
    )
    await store.sync_jobs([job])
    job_id = (await store.active_jobs())["ok"].id
    run_id = await store.pool.fetchval(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at) VALUES ($1, now(), now()) "
        "RETURNING id::text",
        job_id,
    )
    claimed = await store.claim_due_runs("test", 10, timedelta(minutes=1), 100)
    assert [c.run_id for c in claimed] == [run_id]

    poison = {
        "not_json": b"\xff\x00 not json",
        "wrong_schema": json.dumps({"v": 1, "run_id": "not-a-uuid"}).encode(),
        "other_deployment": encode(dispatch("someone-else")),
        "oversized": b"{" + b" " * (MAX_MESSAGE_BYTES + 10) + b"}",
    }
    before = {reason: poison_count(reason) for reason in poison}
    unknown_before = skipped_count("unknown")
    for body in poison.values():
        await broker.js.publish(broker.subject, body)
    # A well-formed dispatch of this deployment for a run this database never had.
    await broker.js.publish(broker.subject, encode(dispatch(deployment)))
    good = DispatchMessage(
        run_id=run_id,
        epoch=claimed[0].epoch,
        job="ok",
        scheduled_at=claimed[0].scheduled_at,
        attempt=1,
        deployment=deployment,
    )
    assert await broker.publish_many([good]) == [None]

    stop = asyncio.Event()
    worker = await jetstream_worker(
        store,
        broker,
        deployment,
        stop,
        worker_id="w1",
        heartbeat=timedelta(seconds=1),
        lease=timedelta(minutes=1),
    )
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(20):
            while (
                await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1::uuid", run_id)
                != "succeeded"
            ):
                assert not task.done(), "the worker stopped"
                await asyncio.sleep(0.05)
            # Every message settled: nothing pending, nothing awaiting an ack.
            while True:
                info = await broker.js.consumer_info(broker.stream, CONSUMER)
                if info.num_pending == 0 and info.num_ack_pending == 0:
                    break
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    for reason in poison:
        assert poison_count(reason) == before[reason] + 1, reason
    assert skipped_count("unknown") == unknown_before + 1
    assert info.num_redelivered == 0

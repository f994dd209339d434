"""Dispatch on real JetStream: a failed publish is compensated, the epoch is in the message id."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.domain import ClaimedRun
from actors.pacing import BrokerGate, ClaimedBatch
from actors.scheduling.compensator import Compensator
from actors.scheduling.dispatcher import Dispatcher
from actors.scheduling.reaper import Reaper
from tests.chaos.broken import FailingPublishes
from tests.integration.helpers import (
    LONG_LEASE,
    add_job,
    drain_stream,
    eventually,
    insert_due_runs,
    make_job,
    stream_count,
)

pytestmark = pytest.mark.integration

OWNER = "replica-a"


async def test_failed_publish_is_released_and_the_dispatcher_goes_on(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> None:
    n, k = 5, 3
    job_id = await add_job(store, make_job())
    await insert_due_runs(store, job_id, n)
    first = await store.claim_due_runs(OWNER, n, LONG_LEASE, max_claimed=1000)
    assert len(first) == n

    inbox: asyncio.Queue[ClaimedBatch | None] = asyncio.Queue(maxsize=4)
    to_release: asyncio.Queue[tuple[ClaimedRun, ...] | None] = asyncio.Queue(maxsize=4)
    gate = BrokerGate()
    failing = FailingPublishes(broker, every=0)
    dispatcher = Dispatcher(failing, deployment, inbox, to_release, gate)
    compensator = Compensator(store, OWNER, to_release)
    tasks = [asyncio.create_task(dispatcher.run()), asyncio.create_task(compensator.run())]
    try:
        # Publishes start in batch order: with n < 2k only the k-th one fails.
        failing.every = k
        await inbox.put(ClaimedBatch(tuple(first)))
        failed = first[k - 1]

        async def released() -> bool:
            return await store.pool.fetchval(
                "SELECT state = 'pending' FROM job_runs WHERE id = $1", failed.run_id
            )

        await eventually(released, what="the unpublished run back in pending")
        row = await store.pool.fetchrow(
            "SELECT state, lease_owner, lease_expires_at, claim_epoch FROM job_runs WHERE id = $1",
            failed.run_id,
        )
        assert (row["state"], row["lease_owner"], row["lease_expires_at"]) == (
            "pending",
            None,
            None,
        )
        assert row["claim_epoch"] == 1
        others = [r.run_id for r in first if r is not failed]
        assert (
            await store.pool.fetchval(
                "SELECT count(*) FROM job_runs WHERE id = ANY($1::uuid[]) AND state = 'claimed'"
                " AND lease_owner = $2",
                others,
                OWNER,
            )
            == n - 1
        )
        assert await stream_count(broker) == n - 1

        # The broker recovers; the same dispatcher publishes the next batch,
        # which carries the released run under its new claim. Claimed once the
        # gate is open again, as the claimer does: a batch that reaches a closed
        # gate goes back unpublished.
        failing.every = 0
        await asyncio.wait_for(gate.wait_open(), 10)
        extra = await insert_due_runs(store, job_id, 2)
        second = await store.claim_due_runs(OWNER, 10, LONG_LEASE, max_claimed=1000)
        assert {r.run_id for r in second} == {failed.run_id, *extra}
        await inbox.put(ClaimedBatch(tuple(second)))

        async def all_published() -> bool:
            return await stream_count(broker) == n - 1 + len(second)

        await eventually(all_published, what="the second batch in the stream")
        assert tasks[0].done() is False
    finally:
        await inbox.put(None)
        await to_release.put(None)
        await asyncio.wait_for(asyncio.gather(*tasks), 10)

    delivered = await drain_stream(broker, n - 1 + len(second))
    assert sorted((m.run_id, m.epoch) for m in delivered) == sorted(
        [(r.run_id, 1) for r in first if r is not failed]
        + [(r.run_id, 2 if r.run_id == failed.run_id else 1) for r in second]
    )


async def test_redispatch_after_reap_is_delivered_but_a_retried_publish_is_deduplicated(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> None:
    job_id = await add_job(store, make_job())
    [run_id] = await insert_due_runs(store, job_id, 1)
    unused: asyncio.Queue[tuple[ClaimedRun, ...] | None] = asyncio.Queue()
    dispatcher = Dispatcher(broker, deployment, asyncio.Queue(), unused, BrokerGate())

    [first] = await store.claim_due_runs(OWNER, 1, timedelta(milliseconds=1), max_claimed=10)
    assert first.epoch == 1
    assert await dispatcher.dispatch(ClaimedBatch((first,))) == []
    assert await stream_count(broker) == 1

    # The lease expires before any worker started it; the reaper returns it.
    reaper = Reaper(store, timedelta(seconds=1), asyncio.Event())

    async def reaped() -> bool:
        return await reaper.reap_once() == 1

    await eventually(reaped, what="the expired claim reaped")
    assert (
        await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1", run_id) == "pending"
    )

    # Claimed and dispatched again well inside the 2-minute duplicate window.
    [second] = await store.claim_due_runs(OWNER, 1, LONG_LEASE, max_claimed=10)
    assert (second.run_id, second.epoch) == (run_id, 2)
    assert await dispatcher.dispatch(ClaimedBatch((second,))) == []
    assert await stream_count(broker) == 2

    # A retried publish of the same claim (same run, same epoch) is deduplicated.
    assert await dispatcher.dispatch(ClaimedBatch((second,))) == []
    assert await stream_count(broker) == 2
    ack = await broker.js.publish(
        broker.subject, b"{}", stream=broker.stream, headers={"Nats-Msg-Id": f"{run_id}:2"}
    )
    assert ack.duplicate is True
    assert await stream_count(broker) == 2

    delivered = await drain_stream(broker, 2)
    assert sorted((m.run_id, m.epoch) for m in delivered) == [(run_id, 1), (run_id, 2)]

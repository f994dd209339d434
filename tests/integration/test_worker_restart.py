"""A worker actor restarted in the same process never runs an attempt twice under one epoch.

The supervisor restarts a crashed worker as the same object with the same
worker id. A run it was executing when it crashed is still `running` under
that id and epoch; the redelivered message must not start it again (that
would be a second execution with the same fencing token, so a downstream
system could not tell them apart). The lease recovers the run and the next
claim hands it a new token. The one case where a `running` row of this worker
and epoch is taken up again is a start whose reply was lost: the worker knows
it never began that execution.

Real PostgreSQL and the real worker loop; the broker is a queue the test
feeds, so that each redelivery arrives exactly when the interleaving needs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import ClaimedRun, ExecutionResult, ExecutorSpec, Outcome, RunContext
from actors.ports import DispatchMessage, NotStarted, StartedRun, StoreUnavailable
from actors.worker import Worker, WorkerSettings
from tests.fakes import RecordingDelivery as Delivery
from tests.integration.helpers import (
    LONG_LEASE,
    add_job,
    eventually,
    insert_due_runs,
    make_job,
    message_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WORKER = "replica-1"


class Deliveries:
    """The pull subscription: hands out what the test puts in, when it puts it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        try:
            first = await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return []  # none
        out = [first]
        while len(out) < batch and not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out

    async def reconnect(self) -> bool:
        return True


class Executions:
    """An executor that records every execution and finishes when released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.began = asyncio.Event()
        self.release = asyncio.Event()

    def runs_inline(self, executor: str | None) -> bool:
        return False

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        self.calls.append((context.run_id, context.fencing_token))
        self.began.set()
        await self.release.wait()
        return ExecutionResult(Outcome.SUCCEEDED)


class FaultyStore(PostgresRunStore):
    """The real store; the heartbeat can be broken (a bug) and one start reply lost."""

    heartbeat_broken = False
    lose_start_reply = False

    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]:
        if self.heartbeat_broken:
            raise RuntimeError("injected: a bug in the heartbeat crashes the worker actor")
        return await super().extend_leases(worker, runs, lease)

    async def start_runs(
        self,
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Any = frozenset(),
    ) -> tuple[list[StartedRun], list[NotStarted]]:
        result = await super().start_runs(worker, messages, lease, retake=retake)
        if self.lose_start_reply:
            self.lose_start_reply = False
            # Committed, but the worker never hears it: the connection dropped.
            raise StoreUnavailable("injected: the start committed, its reply was lost")
        return result


async def _one_claimed_run(
    store: PostgresRunStore,
) -> tuple[ClaimedRun, bytes, dict[bytes, DispatchMessage]]:
    job_id = await add_job(store, make_job("restarted"))
    await insert_due_runs(store, job_id, 1)
    [run] = await store.claim_due_runs("claimer", 1, LONG_LEASE, max_claimed=10)
    data = f"{run.run_id}:{run.epoch}".encode()
    return run, data, {data: message_for(run, "d")}


def _worker(
    store: PostgresRunStore,
    subscription: Deliveries,
    executor: Executions,
    stop: asyncio.Event,
) -> Worker:
    return Worker(
        store,
        subscription,
        executor,
        WorkerSettings(
            worker_id=WORKER,
            deployment="d",
            lease=timedelta(seconds=30),
            heartbeat_interval=timedelta(milliseconds=50),
            concurrency=4,
            grace=timedelta(seconds=5),
        ),
        stop=stop,
    )


async def _row(store: PostgresRunStore, run_id: str) -> tuple[str, int, str | None]:
    row = await store.pool.fetchrow(
        "SELECT state, claim_epoch, lease_owner FROM job_runs WHERE id = $1::uuid", run_id
    )
    assert row is not None
    return row["state"], row["claim_epoch"], row["lease_owner"]


async def test_a_restarted_worker_does_not_run_again_what_it_was_running_when_it_crashed(
    schema_url: str,
) -> None:
    store = await FaultyStore.connect(schema_url, max_size=4)
    try:
        await store.migrate()
        run, data, messages = await _one_claimed_run(store)
        deliveries, executions, stop = Deliveries(), Executions(), asyncio.Event()
        worker = _worker(store, deliveries, executions, stop)

        first = asyncio.create_task(worker.run())
        deliveries.queue.put_nowait(Delivery(messages[data]))
        await asyncio.wait_for(executions.began.wait(), 20)
        # The actor crashes mid-execution: its execution is cancelled, the run
        # stays `running` under this worker id and epoch, its message unacked.
        store.heartbeat_broken = True
        with pytest.raises(ExceptionGroup) as crashed:
            await asyncio.wait_for(first, 20)
        assert crashed.group_contains(RuntimeError, match="injected")
        assert await _row(store, run.run_id) == ("running", run.epoch, WORKER)

        # The supervisor restarts the same worker; JetStream redelivers the message.
        store.heartbeat_broken = False
        again = asyncio.create_task(worker.run())
        try:
            redelivered = Delivery(messages[data])
            deliveries.queue.put_nowait(redelivered)

            async def settled_or_run_again() -> bool:
                return bool(redelivered.settled) or len(executions.calls) > 1

            await eventually(settled_or_run_again, what="the redelivery handled")
            assert executions.calls == [(run.run_id, run.epoch)], (
                "the redelivery ran the attempt again under the same fencing token"
            )
            assert redelivered.settled == ["ack"]
            # Nobody heartbeats it: the lease lapses and the reaper takes it back.
            assert not worker.in_flight
            assert await _row(store, run.run_id) == ("running", run.epoch, WORKER)

            # The lease recovers it (expired by hand: no waiting) under a new token.
            await store.pool.execute(
                "UPDATE job_runs SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = $1::uuid",
                run.run_id,
            )
            assert [r[0] for r in await store.reap_expired_leases(10)] == [run.run_id]
            [next_claim] = await store.claim_due_runs("claimer", 1, LONG_LEASE, max_claimed=10)
            assert next_claim.epoch == run.epoch + 1
            next_data = f"{next_claim.run_id}:{next_claim.epoch}".encode()
            messages[next_data] = message_for(next_claim, "d")
            executions.release.set()
            deliveries.queue.put_nowait(Delivery(messages[next_data]))

            async def succeeded() -> bool:
                return (await _row(store, run.run_id))[0] == "succeeded"

            await eventually(succeeded, what="the recovered run recorded")
            assert executions.calls == [(run.run_id, run.epoch), (run.run_id, run.epoch + 1)]
        finally:
            stop.set()
            await asyncio.wait_for(again, 20)
    finally:
        await store.close()


async def test_a_start_whose_reply_was_lost_is_taken_up_again_by_its_worker(
    schema_url: str,
) -> None:
    store = await FaultyStore.connect(schema_url, max_size=4)
    try:
        await store.migrate()
        run, data, messages = await _one_claimed_run(store)
        deliveries, executions, stop = Deliveries(), Executions(), asyncio.Event()
        executions.release.set()
        worker = _worker(store, deliveries, executions, stop)
        store.lose_start_reply = True
        task = asyncio.create_task(worker.run())
        try:
            lost = Delivery(messages[data])
            deliveries.queue.put_nowait(lost)

            async def naked() -> bool:
                return bool(lost.settled)

            await eventually(naked, what="the delivery whose start reply was lost")
            assert lost.settled == ["nak"]
            # The start did commit: running under this worker, never executed.
            assert await _row(store, run.run_id) == ("running", run.epoch, WORKER)
            assert executions.calls == []

            redelivered = Delivery(messages[data])
            deliveries.queue.put_nowait(redelivered)

            async def succeeded() -> bool:
                return (await _row(store, run.run_id))[0] == "succeeded"

            # Not left to wait out its lease: the worker knows it never began it.
            await eventually(succeeded, what="the run taken up again and recorded")
            assert executions.calls == [(run.run_id, run.epoch)]
            assert redelivered.settled == ["ack"]
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
    finally:
        await store.close()

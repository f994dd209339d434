"""The worker on real JetStream and PostgreSQL: a delivery of a finished run changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp
import pytest

from actors.adapters.nats import JetStreamBroker, encode
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.domain import ClaimedRun, ShellSpec
from actors.ports import Completion
from actors.worker import Worker
from tests.chaos.broken import EXIT_STATUS, Faults
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    Replicas,
    add_job,
    calls_of,
    consumer_counts,
    counter,
    eventually,
    free_port,
    insert_due_runs,
    jetstream_worker,
    make_job,
    message_for,
    scrape,
)

pytestmark = pytest.mark.integration

SKIPPED = "claimd_deliveries_skipped_total"


class SimulatedCrash(BaseException):
    """The process 'dies' between record and ack (no handler of the worker's catches it)."""


class CrashesAfterRecording(PostgresRunStore):
    """The real store; each completion is committed, then the worker 'dies' before its ack."""

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        await super().complete_runs(completions)
        raise SimulatedCrash("worker died after recording, before acking")


@dataclass
class RunningWorker:
    worker: Worker
    task: asyncio.Task[None]
    connection: JetStreamBroker
    stop: asyncio.Event

    async def shutdown(self) -> None:
        self.stop.set()
        # BaseExceptionGroup: a worker that 'died' (SimulatedCrash) ended with it.
        with contextlib.suppress(Exception, BaseExceptionGroup):
            await asyncio.wait_for(self.task, 15)
        await self.connection.close()


class StartWorker(Protocol):
    async def __call__(
        self, worker_id: str, through: PostgresRunStore | None = None
    ) -> RunningWorker: ...


@pytest.fixture
async def workers(
    nats_url: str, broker: JetStreamBroker, store: PostgresRunStore, deployment: str
) -> AsyncIterator[StartWorker]:
    """Start in-process workers, each on its own NATS connection; stopped afterwards."""
    started: list[RunningWorker] = []

    async def start(worker_id: str, through: PostgresRunStore | None = None) -> RunningWorker:
        connection = await JetStreamBroker.connect(
            nats_url, broker.stream, broker.subject, name=worker_id
        )
        stop = asyncio.Event()
        worker = await jetstream_worker(
            through or store,
            connection,
            deployment,
            stop,
            worker_id=worker_id,
        )
        running = RunningWorker(worker, asyncio.create_task(worker.run()), connection, stop)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.shutdown()


async def _dispatch_one(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> ClaimedRun:
    job_id = await add_job(store, make_job("recorded"))
    await insert_due_runs(store, job_id, 1)
    [run] = await store.claim_due_runs("replica", 1, LONG_LEASE, max_claimed=10)
    assert await broker.publish_many([message_for(run, deployment)]) == [None]
    return run


async def _run_row(store: PostgresRunStore, run_id: str) -> tuple[str, int, int]:
    row = await store.pool.fetchrow(
        "SELECT state, attempt, (SELECT count(*) FROM job_run_attempts WHERE run_id = $1) AS n"
        " FROM job_runs WHERE id = $1",
        run_id,
    )
    return row["state"], row["attempt"], row["n"]


async def _settled(broker: JetStreamBroker) -> bool:
    return await consumer_counts(broker) == (0, 0)


async def test_delivery_of_a_terminal_run_is_acked_and_not_executed(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str, workers: StartWorker
) -> None:
    run = await _dispatch_one(store, broker, deployment)
    await workers("worker-1")

    async def succeeded() -> bool:
        return (await _run_row(store, run.run_id))[0] == "succeeded"

    await eventually(succeeded, what="the run recorded")
    await eventually(lambda: _settled(broker), what="the first delivery acked")
    assert len(calls_of(run.run_id)) == 1
    skipped_before = counter(SKIPPED, reason="terminal")

    # The same dispatch arrives again (a duplicate the broker could not dedupe).
    await broker.js.publish(
        broker.subject,
        encode(message_for(run, deployment)),
        stream=broker.stream,
        headers={"Nats-Msg-Id": f"{run.run_id}:{run.epoch}:again"},
    )

    async def skipped() -> bool:
        return counter(SKIPPED, reason="terminal") > skipped_before

    await eventually(skipped, what="the duplicate delivery skipped")
    await eventually(lambda: _settled(broker), what="the duplicate delivery acked")
    assert counter(SKIPPED, reason="terminal") == skipped_before + 1
    assert len(calls_of(run.run_id)) == 1
    assert await _run_row(store, run.run_id) == ("succeeded", 1, 1)


async def test_crash_between_record_and_ack_is_redelivered_and_not_executed_again(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str, workers: StartWorker
) -> None:
    run = await _dispatch_one(store, broker, deployment)

    first = await workers("worker-1", through=CrashesAfterRecording(store.pool))
    with pytest.raises(BaseExceptionGroup) as died:
        await asyncio.wait_for(first.task, 20)
    assert died.group_contains(SimulatedCrash)
    await first.connection.close()  # the process is gone: so is its connection

    assert await _run_row(store, run.run_id) == ("succeeded", 1, 1)
    assert len(calls_of(run.run_id)) == 1
    assert await consumer_counts(broker) == (0, 1)  # delivered, never acked
    skipped_before = counter(SKIPPED, reason="terminal")
    redelivered_before = counter("claimd_redeliveries_total")

    await workers("worker-2")

    async def skipped() -> bool:
        return counter(SKIPPED, reason="terminal") > skipped_before

    # JetStream redelivers after ack_wait; the second worker finds the run finished.
    await eventually(skipped, timeout=30, what="the redelivery skipped")
    await eventually(lambda: _settled(broker), what="the redelivery acked")
    assert counter(SKIPPED, reason="terminal") == skipped_before + 1
    assert counter("claimd_redeliveries_total") == redelivered_before + 1
    assert len(calls_of(run.run_id)) == 1
    assert await _run_row(store, run.run_id) == ("succeeded", 1, 1)


async def test_output_with_a_nul_byte_is_recorded_and_does_not_wedge_the_worker(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str, workers: StartWorker
) -> None:
    # PostgreSQL text cannot hold NUL; binary output (find -print0, a crashed
    # program's dump) must not make the completion fail forever.
    job_id = await add_job(store, make_job("binary", ShellSpec(("printf", "before\\0after"))))
    await insert_due_runs(store, job_id, 2)
    runs = await store.claim_due_runs("replica", 2, LONG_LEASE, max_claimed=10)
    assert await broker.publish_many([message_for(r, deployment) for r in runs]) == [None, None]
    await workers("worker-1")

    async def recorded() -> bool:
        return (
            await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
            == 2
        )

    await eventually(recorded, timeout=15, what="both runs recorded")
    await eventually(lambda: _settled(broker), what="both deliveries acked")
    tails = await store.pool.fetch("SELECT output_tail FROM job_runs")
    assert all(
        t["output_tail"].startswith("before") and t["output_tail"].endswith("after") for t in tails
    )


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    started = Replicas(tmp_path)
    yield started
    await started.stop_all()


async def test_real_process_exiting_before_the_ack_leaves_one_execution(
    store: PostgresRunStore,
    broker: JetStreamBroker,
    tmp_path: Path,
    make_config: Callable[..., LoadedConfig],
    replicas: Replicas,
) -> None:
    executions = tmp_path / "executions"
    loaded = make_config(
        f"""
        [jobs.once]
        cron = "{RARE_CRON}"
        run = {{ shell = 'echo "$CLAIMD_RUN_ID" >> {executions}', use_shell = true }}
        """,
        lease="5s",
        ack_wait="500ms",
        max_deliver=3,
        claim_interval="50ms",
        shutdown_grace="1s",
    )
    config = tmp_path / "claimd.toml"
    port = free_port()
    second_config = tmp_path / "second.toml"
    second_config.write_text(
        config.read_text().replace('http = "off"', f'http = "127.0.0.1:{port}"')
    )
    job_id = await add_job(store, loaded.jobs["once"])
    [run_id] = await insert_due_runs(store, job_id, 1)

    # The first replica records the completion, then exits before acking.
    first = await replicas.start(config, "first", faults=Faults(exit_after_complete=1))
    assert await asyncio.wait_for(first.wait(), 40) == EXIT_STATUS
    assert await _run_row(store, run_id) == ("succeeded", 1, 1)
    assert await consumer_counts(broker) == (0, 1)  # delivered, never acked

    await replicas.start(second_config, "second")

    async def skipped_as_terminal() -> bool:
        try:
            return await scrape(port, SKIPPED, reason="terminal") >= 1
        except aiohttp.ClientError:
            return False  # not serving yet

    await eventually(skipped_as_terminal, timeout=40, what="the redelivery skipped")
    await eventually(lambda: _settled(broker), what="the redelivery acked")
    assert await scrape(port, SKIPPED, reason="terminal") == 1
    assert await scrape(port, "claimd_redeliveries_total") == 1
    assert executions.read_text().split() == [run_id]
    assert await _run_row(store, run_id) == ("succeeded", 1, 1)

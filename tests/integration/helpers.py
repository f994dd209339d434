"""Small helpers shared by the integration tests: jobs, due rows, polling, stream counts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import aiohttp
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from actors.adapters.executors import LocalExecutor
from actors.adapters.nats import CONSUMER, JetStreamBroker
from actors.adapters.nats_inbox import JetStreamInbox
from actors.adapters.postgres import PostgresRunStore
from actors.domain import ClaimedRun, CronSchedule, ExecutorSpec, Job, PythonSpec, RunContext
from actors.ports import DispatchMessage, RunStore
from actors.replica import Replica
from actors.worker import Worker, WorkerSettings
from tests.chaos import broken
from tests.chaos.broken import Faults

# A schedule that (almost) never fires inside a test's horizon: the tests insert
# the rows they want, and a running materializer adds none of its own.
RARE_CRON = "0 0 1 1 *"

# Python job calls recorded in-process: (run_id, attempt, fencing token).
CALLS: list[tuple[str, int, int]] = []


async def record_call(ctx: RunContext) -> None:
    """A python job that only records that it ran (async: in this process, where tests read
    CALLS; a sync job would run in a child process)."""
    CALLS.append((ctx.run_id, ctx.attempt, ctx.fencing_token))


def calls_of(run_id: str) -> list[tuple[str, int, int]]:
    return [c for c in CALLS if c[0] == run_id]


def make_job(
    name: str = "job", executor: ExecutorSpec | None = None, *, max_attempts: int = 3
) -> Job:
    return Job(
        name=name,
        schedule=CronSchedule(RARE_CRON, "UTC"),
        executor=executor or PythonSpec("tests.integration.helpers:record_call"),
        max_attempts=max_attempts,
    )


async def add_job(store: PostgresRunStore, job: Job) -> int:
    """Write the job row; returns its id."""
    await store.sync_jobs([job])
    return (await store.active_jobs())[job.name].id


async def insert_due_runs(store: PostgresRunStore, job_id: int, count: int) -> list[str]:
    """Insert ``count`` pending runs, due within the last minute; returns their ids.

    Recent on purpose: a first attempt far past its instant would be skipped by
    the start-deadline policy instead of run.
    """
    rows = await store.pool.fetch(
        """INSERT INTO job_runs (job_id, scheduled_at, due_at)
           SELECT $1, t, t
             FROM generate_series(1, $2::int) AS g,
                  LATERAL (SELECT now() - interval '1 minute' + g * interval '1 ms') AS i(t)
           RETURNING id::text""",
        job_id,
        count,
    )
    return [r["id"] for r in rows]


def message_for(run: ClaimedRun, deployment: str) -> DispatchMessage:
    return DispatchMessage(
        run_id=run.run_id,
        epoch=run.epoch,
        job=run.job,
        scheduled_at=run.scheduled_at,
        attempt=run.attempt,
        deployment=deployment,
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 20.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds; fail the test after a generous deadline."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def stream_count(broker: JetStreamBroker) -> int:
    """Messages currently held by the test's stream."""
    info = await broker.js.stream_info(broker.stream)
    return int(info.state.messages)


async def consumer_counts(broker: JetStreamBroker) -> tuple[int, int]:
    """(messages not yet delivered, messages delivered but not acked) of the worker consumer."""
    info = await broker.js.consumer_info(broker.stream, CONSUMER)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def drain_stream(
    broker: JetStreamBroker, expected: int, timeout: float = 10.0
) -> list[DispatchMessage]:
    """Fetch and ack messages from the consumer until ``expected`` arrived (or the deadline)."""
    from actors.adapters.nats import decode

    deployment = broker.subject.split(".")[1]
    sub = await broker.pull_subscription()
    got: list[DispatchMessage] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(expected - len(got), timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                got.append(decode(msg.data, deployment))
                await msg.ack()
        # One more short fetch: more than expected must show up as a failure.
        try:
            extra = await sub.fetch(10, timeout=0.5)
        except TimeoutError:
            extra = []
        for msg in extra:
            got.append(decode(msg.data, deployment))
            await msg.ack()
    finally:
        await sub.unsubscribe()
    return got


def counter(name: str, **labels: str) -> float:
    """Current value of a Prometheus sample of this process (0 when never touched)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


LONG_LEASE = timedelta(minutes=5)
REPO = str(Path(__file__).resolve().parents[2])


def claimd_command() -> list[str]:
    """The real entry point, from the same environment as the tests."""
    script = Path(sys.executable).with_name("claimd")
    return [str(script)] if script.exists() else [sys.executable, "-m", "actors.cli"]


class Replicas:
    """`claimd run` processes started by a test; whatever is still alive is stopped after."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(
        self,
        config: Path,
        name: str,
        *,
        faults: Faults | None = None,
        role: str = "all",
        **env: str,
    ) -> asyncio.subprocess.Process:
        """`claimd run` on ``config``; with ``faults``, the chaos harness's broken build.

        ``env`` is added to the child's environment as given (a CLAIMD_* variable
        there is the test's own choice).
        """
        # Only the config file speaks: no CLAIMD_* variable of the test run leaks in.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMD_")}
        # Test job functions live in tests/: importable however claimd was installed.
        clean["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, clean.get("PYTHONPATH")]))
        with (self.log_dir / f"{name}.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *(broken.command(faults) if faults else claimd_command()),
                "--log-level",
                "WARNING",
                "run",
                "--config",
                str(config),
                "--role",
                role,
                env={**clean, **env},
                stdout=log,
                stderr=log,
            )
        self.procs.append(proc)
        return proc

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def scrape(port: int, name: str, **labels: str) -> float:
    """One sample from a replica's /metrics (0 when absent)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


@asynccontextmanager
async def running(*replicas: Replica, stop_timeout: float = 40.0) -> AsyncIterator[None]:
    """Run in-process replicas for the body of a ``with``; stop them and surface crashes."""
    tasks = [asyncio.create_task(r.run()) for r in replicas]
    try:
        yield
    finally:
        for replica in replicas:
            replica.stop_requested.set()
        for task in tasks:
            await asyncio.wait_for(task, stop_timeout)


async def succeeded_runs(store: PostgresRunStore) -> int:
    return int(await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'succeeded'"))


async def inbox_of(broker: JetStreamBroker, deployment: str) -> JetStreamInbox:
    """The worker's inbox on ``broker``'s consumer, bound anew as the replica would."""

    async def probe() -> None:
        await broker.probe(broker.publish_timeout)

    return JetStreamInbox(
        await broker.pull_subscription(),
        deployment,
        rebind=broker.pull_subscription,
        probe=probe,
    )


async def jetstream_worker(
    store: RunStore,
    broker: JetStreamBroker,
    deployment: str,
    stop: asyncio.Event,
    *,
    worker_id: str = "w",
    concurrency: int = 4,
    heartbeat: timedelta = timedelta(milliseconds=500),
    lease: timedelta = timedelta(seconds=30),
) -> Worker:
    """A worker on the test's stream with the real executor, as the integration tests build it."""
    return Worker(
        store,
        await inbox_of(broker, deployment),
        LocalExecutor(),
        WorkerSettings(
            worker_id=worker_id,
            deployment=deployment,
            lease=lease,
            heartbeat_interval=heartbeat,
            concurrency=concurrency,
            grace=timedelta(seconds=5),
        ),
        stop=stop,
    )

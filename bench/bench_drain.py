"""Drain: how fast a due backlog is worked off, claimd against a minimal pipeline.

Seeds ``--runs`` due runs over ``--jobs`` jobs (an async no-op python job,
``bench.common:anoop``, on a yearly cron so that the materializer adds nothing
due meanwhile), then works the backlog off, each configuration in a schema
and a stream of its own (dropped afterwards):

- ``pipeline``: the minimal pipeline, written here with no framework, in this
  process: claim 100 with FOR UPDATE SKIP LOCKED -> ``publish_async`` each
  (acks collected per batch) -> fetch 100 from a durable pull consumer -> one
  UPDATE per fetched batch -> ack each. The same schema, stream and consumer
  shape as claimd's; as many claimed-but-unrecorded runs as claimd's
  ``max_claimed``. It executes nothing (claimd calls the no-op job). One lane:
  one claimer, one fetch -> complete -> ack loop, 2 connections;
- ``pipeline-fast``: the strongest baseline written here, the ratios' base:
  the same statements and messages with every step overlapped (2 claimers of
  1,000, publishes in flight while the next claim runs, 2 fetch loops of 1,000,
  each fetched batch completed on one of 8 connections and acked while its
  loop fetches again);
- ``one``: one ``claimd run`` (every role, one process);
- ``split``: ``claimd run --role scheduler`` and ``claimd run --role worker``;
- ``split-2w`` (not by default): one scheduler and two workers;
- ``replicas-2``, ``replicas-4``: two and four full replicas.

Each claimd process is the real command (``python -m actors.cli run``) in a
subprocess, with claimd's defaults and ``--log-level warning``. The drain rate
is the runs recorded succeeded over the time from the first run's start to
the last run's finish, both read from ``job_runs`` (the database's clock), so
process start-up is in no figure. CPU is the processes' own (``/proc``),
from the first recorded run to the end, per 1000 runs.

Beside it, the claim statement alone: ``--claimers`` concurrent claimers
taking batches of 100 from a backlog of their own, with ``FOR UPDATE SKIP
LOCKED`` and with plain ``FOR UPDATE`` (which waits for the rows another
claimer holds).

Correctness line: runs not recorded succeeded (lost), runs with more than one
attempt row (recorded twice), (job, instant) with more than one row (doubled),
runs claimed twice by the claim measure.

    python -m bench.bench_drain [--runs 20000 --jobs 100]
    python -m bench.bench_drain --against TREE   # each claimd config also from TREE
    python -m bench.bench_drain --configs pipeline,one,split-2w --runs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import nats
from nats.js import api

from actors.adapters.nats import MAX_MESSAGE_BYTES, encode
from actors.adapters.postgres import PostgresRunStore
from actors.config import parse_config
from actors.ports import DispatchMessage
from bench.common import (
    REPO,
    Row,
    bench_schema,
    child_env,
    config_toml,
    delete_stream,
    environment,
    migrated_store,
    nats_url,
    print_table,
    stop_processes,
)
from tests.servers import unique_name

# Which `claimd run --role` processes each configuration starts.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "one": ("all",),
    "split": ("scheduler", "worker"),
    "split-2w": ("scheduler", "worker", "worker"),
    "replicas-2": ("all", "all"),
    "replicas-4": ("all", "all", "all", "all"),
}
PIPELINES = ("pipeline", "pipeline-fast")
DESCRIBED = {
    "pipeline": "minimal pipeline, one lane (1 process)",
    "pipeline-fast": "fastest pipeline (1 process)",
    "one": "claimd run, all roles (1 process)",
    "split": "scheduler + worker (2 processes)",
    "split-2w": "scheduler + 2 workers (3 processes)",
    "replicas-2": "2 full replicas",
    "replicas-4": "4 full replicas",
}
DEFAULT_CONFIGS = "pipeline,pipeline-fast,one,split,replicas-2,replicas-4"
MAX_CLAIMED = 20_000  # claimd's default max_claimed: the pipeline keeps the same bound
PIPELINE_BATCH = 100
CONSUMER = "workers"


def jobs_toml(n_jobs: int) -> str:
    """Jobs that never come due during the benchmark: the seeded rows are all the work."""
    return "\n".join(
        textwrap.dedent(f"""
            [jobs.drain-{i:05d}]
            cron = "0 0 1 1 *"
            timeout = "30s"
            run = {{ python = "bench.common:anoop" }}
        """)
        for i in range(n_jobs)
    )


# Due within the last five minutes: inside the default start deadline
# (catchup_window 1 h), so every run is claimed rather than skipped.
SEED = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT j.id, now() - interval '5 minutes' + g * $2::float8 * interval '1 millisecond',
             now() - interval '5 minutes' + g * $2::float8 * interval '1 millisecond'
  FROM jobs j, generate_series(1, $1::int) AS g
"""
STATS = """
SELECT count(*) AS total,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state IN ('pending', 'claimed', 'running')) AS unfinished,
       min(started_at) FILTER (WHERE state = 'succeeded') AS first_start,
       max(finished_at) FILTER (WHERE state = 'succeeded') AS last_finish
  FROM job_runs
"""
NOT_DONE = "SELECT count(*) FROM job_runs WHERE state IN ('pending', 'claimed', 'running')"
SUCCEEDED = "SELECT count(*) FROM job_runs WHERE state = 'succeeded'"
BY_STATE = "SELECT state::text, count(*) FROM job_runs GROUP BY 1 ORDER BY 1"
DOUBLED = """
SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs
                       GROUP BY 1, 2 HAVING count(*) > 1) d
"""
RECORDED_TWICE = """
SELECT count(*) FROM (SELECT run_id FROM job_run_attempts GROUP BY 1 HAVING count(*) > 1) d
"""

# The minimal pipeline's statements: one claim, one completion, nothing else.
PIPELINE_CLAIM = """
WITH c AS (
    SELECT id FROM job_runs
     WHERE state = 'pending' AND due_at <= now()
     ORDER BY due_at
       FOR UPDATE {lock}
     LIMIT $1
)
UPDATE job_runs r
   SET state = 'claimed', claim_epoch = r.claim_epoch + 1, lease_owner = $2,
       lease_expires_at = now() + interval '120 seconds', claimed_at = now(),
       started_at = now(), updated_at = now()
  FROM c, jobs j
 WHERE r.id = c.id AND j.id = r.job_id
RETURNING r.id::text, r.claim_epoch, j.name, r.scheduled_at, r.attempt
"""
# `r.id = ANY`: the primary key drives the update in the generic plan too (asyncpg
# prepares statements; from the sixth call on, PostgreSQL may plan them
# generically, and the join alone then hashed every claimed row: 115 ms per call).
PIPELINE_COMPLETE = """
UPDATE job_runs r
   SET state = 'succeeded', outcome = 'succeeded', finished_at = now(),
       lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
  FROM unnest($1::uuid[], $2::bigint[]) AS m(id, epoch)
 WHERE r.id = ANY ($1::uuid[]) AND r.id = m.id AND r.claim_epoch = m.epoch
   AND r.state = 'claimed'
RETURNING r.id::text
"""


@dataclass
class Drained:
    """One configuration's figures."""

    name: str
    seeded: int
    tree: str = ""  # "" for this checkout, else the label of the --against tree
    succeeded: int = 0
    unfinished: int = 0  # still pending, claimed or running when the config was stopped
    seconds: float = float("nan")  # first start to last finish
    cpu_s: float = float("nan")  # the processes', from the first recorded run
    cpu_runs: int = 0  # runs recorded over that CPU
    recorded_twice: int = 0
    doubled: int = 0
    redelivered: int = 0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load before and after
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.succeeded / self.seconds if self.seconds > 0 else float("nan")

    @property
    def lost(self) -> int:
        """Runs that ended in another state than succeeded (a no-op job always succeeds)."""
        return self.seeded - self.succeeded - self.unfinished

    @property
    def label(self) -> str:
        return f"{self.name} [{self.tree}]" if self.tree else self.name

    @property
    def cpu_per_1000(self) -> float:
        return 1000 * self.cpu_s / self.cpu_runs if self.cpu_runs else float("nan")


# --- seeding -------------------------------------------------------------------------------


async def seed(store: PostgresRunStore, n_jobs: int, runs: int) -> int:
    """The jobs (synced as a replica would) and ``runs`` due runs spread over them."""
    loaded = parse_config(jobs_toml(n_jobs), "<bench>", env={})
    await store.sync_jobs(list(loaded.jobs.values()))
    per_job = max(1, runs // n_jobs)
    spacing_ms = min(10.0, 290_000 / per_job)
    async with store.pool.acquire() as conn:
        status = await conn.execute(SEED, per_job, spacing_ms)
        await conn.execute("VACUUM ANALYZE job_runs")
    return int(status.split()[-1])


async def _finish(store: PostgresRunStore, result: Drained) -> None:
    row = await store.pool.fetchrow(STATS)
    result.succeeded = row["succeeded"]
    result.unfinished = row["unfinished"]
    if row["first_start"] is not None:
        result.seconds = (row["last_finish"] - row["first_start"]).total_seconds()
    result.doubled = await store.pool.fetchval(DOUBLED)
    result.recorded_twice = await store.pool.fetchval(RECORDED_TWICE)
    result.load = (result.load[0], os.getloadavg()[0])


# --- (a) the minimal pipeline --------------------------------------------------------------


async def pipeline(args: argparse.Namespace, name: str = "pipeline") -> Drained:
    """The minimal pipeline: claim -> publish_async -> fetch -> one UPDATE -> ack, one process.

    ``pipeline``: one lane (one claimer, one fetch -> complete -> ack loop, 2
    connections); ``pipeline-fast``: the same steps overlapped as far as they go
    (``_pipeline_fast``).
    """
    fast = name == "pipeline-fast"
    connections = 2 if not fast else args.fast_claimers + args.fast_completers
    async with bench_schema() as url, migrated_store(url, max_size=2) as store:
        seeded = await seed(store, args.jobs, args.runs)
        result = Drained(name, seeded, load=(os.getloadavg()[0], 0.0))
        deployment = unique_name("bench")
        stream, subject = f"CLAIMD_{deployment}", f"claimd.{deployment}.runs"
        nc = await nats.connect(nats_url(), name="claimd-bench-pipeline")
        js = nc.jetstream()
        pool = await asyncpg.create_pool(url, min_size=connections, max_size=connections)
        try:
            await js.add_stream(
                api.StreamConfig(
                    name=stream,
                    subjects=[subject],
                    retention=api.RetentionPolicy.WORK_QUEUE,
                    storage=api.StorageType.FILE,
                    duplicate_window=120,
                    max_age=240,
                    max_msg_size=MAX_MESSAGE_BYTES * 4,
                )
            )
            await js.add_consumer(
                stream,
                api.ConsumerConfig(
                    durable_name=CONSUMER,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    ack_wait=5,
                    max_deliver=5,
                    max_ack_pending=10_000,
                    filter_subject=subject,
                ),
            )
            psub = await js.pull_subscribe_bind(durable=CONSUMER, stream=stream)
            cpu = time.process_time()
            lanes = _pipeline_fast(args) if fast else _pipeline
            await asyncio.wait_for(
                lanes(pool, js, psub, deployment, stream, subject, seeded, result),
                args.max_seconds,
            )
            result.cpu_s = time.process_time() - cpu
            result.cpu_runs = seeded
        finally:
            await pool.close()
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
            await nc.close()
        await _finish(store, result)
        return result


async def _pipeline(
    pool: asyncpg.Pool,
    js: Any,
    psub: Any,
    deployment: str,
    stream: str,
    subject: str,
    seeded: int,
    result: Drained,
) -> None:
    recorded = claimed = 0
    slot = asyncio.Event()
    claim = PIPELINE_CLAIM.format(lock="SKIP LOCKED")
    steps = dict.fromkeys(("claim", "publish", "fetch", "complete", "ack", "fetched batches"), 0.0)

    async def claimer() -> None:
        nonlocal claimed
        while claimed < seeded:
            if claimed - recorded >= MAX_CLAIMED:
                slot.clear()
                await slot.wait()
                continue
            began = time.perf_counter()
            rows = await pool.fetch(claim, PIPELINE_BATCH, "pipeline")
            steps["claim"] += time.perf_counter() - began
            if not rows:
                await asyncio.sleep(0.05)
                continue
            claimed += len(rows)
            began = time.perf_counter()
            acks = []
            for r in rows:
                message = DispatchMessage(r[0], r[1], r[2], r[3], r[4], deployment)
                acks.append(
                    await js.publish_async(
                        subject,
                        encode(message),
                        stream=stream,
                        headers={"Nats-Msg-Id": message.msg_id},
                    )
                )
            await asyncio.gather(*acks)
            steps["publish"] += time.perf_counter() - began

    async def worker() -> None:
        nonlocal recorded
        while recorded < seeded:
            began = time.perf_counter()
            try:
                msgs = await psub.fetch(PIPELINE_BATCH, timeout=1)
            except TimeoutError:
                continue
            finally:
                steps["fetch"] += time.perf_counter() - began
            steps["fetched batches"] += 1
            began = time.perf_counter()
            bodies = [json.loads(m.data) for m in msgs]
            result.redelivered += sum(1 for m in msgs if m.metadata.num_delivered > 1)
            done = await pool.fetch(
                PIPELINE_COMPLETE, [b["run_id"] for b in bodies], [b["epoch"] for b in bodies]
            )
            recorded += len(done)
            steps["complete"] += time.perf_counter() - began
            slot.set()
            began = time.perf_counter()
            for m in msgs:
                await m.ack()
            steps["ack"] += time.perf_counter() - began

    await asyncio.gather(claimer(), worker())
    batches = steps.pop("fetched batches")
    result.notes.append(
        "seconds spent: "
        + ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
        + f" (claims and publishes overlap fetch-complete-ack; {batches:.0f} fetched batches)"
    )


def _pipeline_fast(args: argparse.Namespace) -> Callable[..., Any]:
    """The same statements and messages, every step overlapped with the others (``Lanes``)."""

    async def lanes(
        pool: asyncpg.Pool,
        js: Any,
        psub: Any,
        deployment: str,
        stream: str,
        subject: str,
        seeded: int,
        result: Drained,
    ) -> None:
        await Lanes(args, pool, js, psub, deployment, stream, subject, seeded, result).run()

    return lanes


class Lanes:
    """``--fast-claimers`` claimers (SKIP LOCKED, ``--fast-batch`` runs a claim), each
    batch published with ``publish_async`` while the next claim runs;
    ``--fast-fetchers`` fetch loops of ``--fast-batch`` messages, each fetched batch
    completed by one UPDATE on a connection of its own (at most
    ``--fast-completers`` at once) and then acked, while its loop fetches again."""

    def __init__(
        self,
        args: argparse.Namespace,
        pool: asyncpg.Pool,
        js: Any,
        psub: Any,
        deployment: str,
        stream: str,
        subject: str,
        seeded: int,
        result: Drained,
    ) -> None:
        self.batch, self.claimers = args.fast_batch, args.fast_claimers
        self.fetchers, self.completers = args.fast_fetchers, args.fast_completers
        self.pool, self.js, self.psub = pool, js, psub
        self.deployment, self.stream, self.subject = deployment, stream, subject
        self.seeded, self.result = seeded, result
        self.recorded = self.claimed = 0
        self.slot, self.done = asyncio.Event(), asyncio.Event()
        self.claim = PIPELINE_CLAIM.format(lock="SKIP LOCKED")
        self.publishing = asyncio.Semaphore(2 * self.claimers)
        self.completing = asyncio.Semaphore(self.completers)
        self.tasks: set[asyncio.Task[None]] = set()

    def _keep(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        # A pull subscription each: concurrent fetches on one would share its inbox.
        subs = [self.psub] + [
            await self.js.pull_subscribe_bind(durable=CONSUMER, stream=self.stream)
            for _ in range(self.fetchers - 1)
        ]
        workers = [asyncio.create_task(self._fetcher(sub)) for sub in subs]
        await asyncio.gather(*(self._claimer(i) for i in range(self.claimers)))
        await self.done.wait()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, *self.tasks, return_exceptions=True)
        self.result.notes.append(
            f"{self.claimers} claimers, {self.fetchers} fetch loops, batches of {self.batch}, "
            f"completions on up to {self.completers} connections at once"
        )

    async def _publish(self, rows: list[asyncpg.Record]) -> None:
        try:
            acks = []
            for r in rows:
                message = DispatchMessage(r[0], r[1], r[2], r[3], r[4], self.deployment)
                acks.append(
                    await self.js.publish_async(
                        self.subject,
                        encode(message),
                        stream=self.stream,
                        headers={"Nats-Msg-Id": message.msg_id},
                    )
                )
            await asyncio.gather(*acks)
        finally:
            self.publishing.release()

    async def _claimer(self, index: int) -> None:
        while self.claimed < self.seeded and not self.done.is_set():
            if self.claimed - self.recorded >= MAX_CLAIMED:
                self.slot.clear()
                await self.slot.wait()
                continue
            rows = await self.pool.fetch(self.claim, self.batch, f"pipeline-{index}")
            if not rows:
                await asyncio.sleep(0.05)
                continue
            self.claimed += len(rows)
            await self.publishing.acquire()
            self._keep(self._publish(rows))

    async def _complete(self, msgs: list[Any]) -> None:
        try:
            bodies = [json.loads(m.data) for m in msgs]
            self.result.redelivered += sum(1 for m in msgs if m.metadata.num_delivered > 1)
            finished = await self.pool.fetch(
                PIPELINE_COMPLETE, [b["run_id"] for b in bodies], [b["epoch"] for b in bodies]
            )
            self.recorded += len(finished)
            self.slot.set()
            for m in msgs:
                await m.ack()
            if self.recorded >= self.seeded:
                self.done.set()
        finally:
            self.completing.release()

    async def _fetcher(self, psub: Any) -> None:
        while not self.done.is_set():
            try:
                msgs = await psub.fetch(self.batch, timeout=1)
            except TimeoutError:
                continue
            await self.completing.acquire()
            self._keep(self._complete(msgs))


# --- (b)-(d) claimd processes --------------------------------------------------------------


def _settings(pairs: Sequence[str]) -> dict[str, object]:
    """``--set key=value`` pairs as claimd settings (integers as integers)."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return out


def _spawn(
    config: Path, roles: Sequence[str], logs: Sequence[Path], log_level: str, tree: Path
) -> list[subprocess.Popen[bytes]]:
    """One real `claimd run --role ROLE` per role, its log in a file of its own.

    ``python -m`` puts the working directory first on the path: the processes
    run the ``actors`` package of ``tree`` (this checkout, or --against).
    """
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "actors.cli",
                "run",
                "--config",
                str(config),
                "--role",
                role,
                "--log-level",
                log_level,
            ],
            cwd=tree,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )
        for role, log in zip(roles, logs, strict=True)
    ]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def claimd(name: str, args: argparse.Namespace, tree: Path = REPO) -> Drained:
    """Start the configuration's `claimd run` processes on a seeded backlog; drain it."""
    roles = LAYOUTS[name]
    deployment = unique_name("bench")
    try:
        async with bench_schema() as url, migrated_store(url, max_size=2) as store:
            seeded = await seed(store, args.jobs, args.runs)
            label = "" if tree == REPO else args.against_label
            result = Drained(name, seeded, label, load=(os.getloadavg()[0], 0.0))
            with tempfile.TemporaryDirectory(prefix="claimd-drain-") as tmp:
                config = Path(tmp) / "claimd.toml"
                config.write_text(
                    config_toml(url, deployment, jobs_toml(args.jobs), **_settings(args.set))
                )
                logs = [Path(tmp) / f"{i}-{role}.log" for i, role in enumerate(roles)]
                procs = _spawn(config, roles, logs, args.log_level, tree)
                spies: list[subprocess.Popen[bytes]] = []
                try:
                    await _until_drained(
                        store,
                        procs,
                        result,
                        args.max_seconds,
                        f"CLAIMD_{deployment}" if args.trace else None,
                        lambda: spies.extend(
                            _spy(procs, roles, result.label.replace(" ", ""), args.py_spy)
                        ),
                    )
                finally:
                    stop_processes(spies, signal.SIGINT)
                    stop_processes(procs)
                for proc, log in zip(procs, logs, strict=True):
                    if proc.returncode not in (0, -signal.SIGTERM):
                        tail = log.read_text(errors="replace")[-2000:]
                        result.notes.append(f"process exited {proc.returncode}: {tail}")
            await _finish(store, result)
            return result
    finally:
        await delete_stream(f"CLAIMD_{deployment}")


def _spy(
    procs: Sequence[subprocess.Popen[bytes]], roles: Sequence[str], name: str, folder: str | None
) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` on each process (collapsed stacks, one file each), if asked."""
    if not folder:
        return []
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(p.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--output",
                str(Path(folder) / f"{name}-{i}-{role}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, (p, role) in enumerate(zip(procs, roles, strict=True))
    ]


async def _consumer_figures(stream: str) -> str:
    """The dispatch consumer's undelivered and unacknowledged counts (for --trace)."""
    nc = await nats.connect(nats_url(), name="claimd-bench-trace")
    try:
        info = await nc.jetstream().consumer_info(stream, CONSUMER)
        return f"undelivered {info.num_pending} unacked {info.num_ack_pending}"
    except Exception as exc:  # noqa: BLE001 - a trace line, not a figure
        return f"consumer: {exc!r}"
    finally:
        await nc.close()


async def _until_drained(
    store: PostgresRunStore,
    procs: Sequence[subprocess.Popen[bytes]],
    result: Drained,
    limit: float,
    trace: str | None,
    on_first_run: Callable[[], None],
) -> None:
    """Poll until no run is left to do (or a process died, or the time is up)."""
    deadline = time.monotonic() + limit
    cpu0: list[float] | None = None
    recorded0 = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        if trace:
            states = dict(await store.pool.fetch(BY_STATE))
            consumer = await _consumer_figures(trace)
            print(f"  {time.monotonic() - deadline + limit:6.2f}s {states} {consumer}", flush=True)
        if any(p.poll() is not None for p in procs):
            result.notes.append("a process stopped before the backlog was drained")
            return
        if cpu0 is None:
            recorded0 = await store.pool.fetchval(SUCCEEDED)
            if recorded0:
                cpu0 = [_cpu_seconds(p.pid) for p in procs]
                on_first_run()
            continue
        if await store.pool.fetchval(NOT_DONE) == 0:
            break
    else:
        result.notes.append(f"not drained within {limit:.0f}s: stopped")
    if cpu0 is not None:
        result.cpu_s = sum(_cpu_seconds(p.pid) for p in procs) - sum(cpu0)
        result.cpu_runs = await store.pool.fetchval(SUCCEEDED) - recorded0


# --- the claim statement: SKIP LOCKED against plain FOR UPDATE ------------------------------


@dataclass
class Claimed:
    lock: str
    claimers: int
    ids: list[str] = field(default_factory=list)
    seconds: float = 0.0
    waits_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return len(self.ids) / self.seconds if self.seconds else float("nan")

    @property
    def twice(self) -> int:
        return len(self.ids) - len(set(self.ids))


async def _claim_all(pool: asyncpg.Pool, statement: str, result: Claimed, budget: float) -> None:
    deadline = time.perf_counter() + budget

    async def claim(owner: str) -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            rows = await pool.fetch(statement, PIPELINE_BATCH, owner)
            result.waits_ms.append(1000 * (time.perf_counter() - began))
            if not rows:
                return
            result.ids.extend(row[0] for row in rows)

    start = time.perf_counter()
    await asyncio.gather(*(claim(f"claimer-{i}") for i in range(result.claimers)))
    result.seconds = time.perf_counter() - start


async def claim_measure(args: argparse.Namespace) -> list[Claimed]:
    """``--claimers`` claimers take batches of 100 until the backlog is gone, per lock mode."""
    out = []
    async with bench_schema() as url, migrated_store(url, max_size=2) as store:
        for lock in ("SKIP LOCKED", ""):
            await store.pool.execute("TRUNCATE job_runs CASCADE")
            await seed(store, args.jobs, args.claim_runs)
            result = Claimed(lock or "plain", args.claimers)
            statement = PIPELINE_CLAIM.format(lock=lock)
            pool = await asyncpg.create_pool(url, min_size=args.claimers, max_size=args.claimers)
            try:
                await _claim_all(pool, statement, result, args.claim_seconds)
            finally:
                await pool.close()
            out.append(result)
    return out


# --- the report ----------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2] if values else float("nan")


def report(results: dict[str, Drained], claims: list[Claimed], args: argparse.Namespace) -> None:
    base = results.get("pipeline-fast") or results.get("pipeline")
    base_name = base.name if base is not None else ""
    rows = [
        Row(
            DESCRIBED[r.name] + (f" [{r.tree}]" if r.tree else ""),
            r.rate,
            None if base is None or r.name == base_name else base.rate,
            "runs/s",
            compared=r.name != base_name,
        )
        for r in results.values()
    ]
    rows += [
        Row(
            f"  CPU per 1000 runs: {r.label}",
            r.cpu_per_1000,
            None if base is None or r.name == base_name else base.cpu_per_1000,
            "s",
            higher_is_better=False,
            compared=r.name != base_name,
        )
        for r in results.values()
    ]
    notes = [
        "figure = drain rate (runs recorded succeeded / first start to last finish); "
        f"baseline = {DESCRIBED.get(base_name, 'none')} in the same run; ratio = figure / baseline "
        "(CPU: baseline / figure)",
        "goals: one claimd run >= 0.9x; best multi-process layout >= 1.3x; "
        "1 -> 2 -> 4 replicas not falling",
    ]
    for r in results.values():
        notes.append(
            f"{r.label}: {r.succeeded} of {r.seeded} succeeded in {r.seconds:.2f}s; "
            f"load {r.load[0]:.2f} -> {r.load[1]:.2f}; CPU {r.cpu_s:.1f}s over {r.cpu_runs} runs"
        )
        notes.extend(f"  {n}" for n in r.notes)
    replicas = [results[n].rate for n in ("one", "replicas-2", "replicas-4") if n in results]
    before = [
        results[f"{n} [{args.against_label}]"].rate
        for n in ("one", "replicas-2", "replicas-4")
        if f"{n} [{args.against_label}]" in results
    ]
    if len(replicas) > 1:
        steady = all(b >= a * 0.95 for a, b in itertools.pairwise(replicas))
        notes.append(
            "replicas 1 -> 2 -> 4: "
            + " -> ".join(f"{x:,.0f}" for x in replicas)
            + f" runs/s ({'not falling' if steady else 'FALLS'}, 5% noise allowed)"
            + (f"; [{args.against_label}] " + " -> ".join(f"{x:,.0f}" for x in before))
            * bool(before)
        )
    if claims:
        skip, plain = claims
        notes.append(
            f"claim statement alone, {skip.claimers} concurrent claimers, batches of "
            f"{PIPELINE_BATCH}: FOR UPDATE SKIP LOCKED {skip.rate:,.0f} runs/s (median "
            f"{_median(skip.waits_ms):.1f} ms/claim) vs plain FOR UPDATE {plain.rate:,.0f} "
            f"runs/s (median {_median(plain.waits_ms):.1f} ms/claim): "
            f"{skip.rate / plain.rate:.1f}x"
        )
    notes.append(
        "correctness: lost "
        f"{sum(r.lost for r in results.values())} (unfinished when stopped at the time limit: "
        f"{sum(r.unfinished for r in results.values())}), recorded twice "
        f"{sum(r.recorded_twice for r in results.values())}, doubled "
        f"{sum(r.doubled for r in results.values())}, claimed twice "
        f"{sum(c.twice for c in claims)}; redelivered (pipeline) "
        f"{base.redelivered if base is not None else 0}"
    )
    print_table(
        f"drain: {args.runs:,} due runs over {args.jobs} jobs (async no-op), "
        f"{', '.join(args.set) or 'claimd defaults'}, log level {args.log_level}",
        rows,
        notes,
    )


async def main(args: argparse.Namespace) -> None:
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in PIPELINES and n not in LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown configuration(s): {', '.join(unknown)}")
    async with bench_schema() as url, migrated_store(url, max_size=1) as store:
        print(await environment(store.pool), f"load {os.getloadavg()[0]:.2f}", datetime.now())
    results: dict[str, Drained] = {}
    runs: list[tuple[str, Path]] = []
    for name in names:
        if args.against and name not in PIPELINES:
            runs.append((name, Path(args.against)))  # the other tree first, then this one
        runs.append((name, REPO))
    for name, tree in runs:
        began = time.monotonic()
        result = await (pipeline(args, name) if name in PIPELINES else claimd(name, args, tree))
        results[result.label] = result
        print(
            f"  {result.label}: {result.rate:,.0f} runs/s, {result.succeeded}/{result.seeded} "
            f"in {result.seconds:.2f}s (config took {time.monotonic() - began:.0f}s, load "
            f"{result.load[0]:.2f} -> {result.load[1]:.2f})",
            flush=True,
        )
    claims = await claim_measure(args) if args.claimers > 0 else []
    report(results, claims, args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000, help="due runs seeded per config")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"comma-separated: pipeline, {', '.join(LAYOUTS)} (default {DEFAULT_CONFIGS})",
    )
    parser.add_argument("--log-level", default="warning", help="the claimd processes' log level")
    parser.add_argument("--fast-batch", type=int, default=1000, help="pipeline-fast's claim/fetch")
    parser.add_argument("--fast-claimers", type=int, default=2)
    parser.add_argument("--fast-fetchers", type=int, default=2)
    parser.add_argument("--fast-completers", type=int, default=8, help="its connections")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a claimd setting for every claimd process (e.g. worker_concurrency=256); "
        "default: claimd's defaults",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="give up on a config after this long"
    )
    parser.add_argument(
        "--claimers", type=int, default=4, help="concurrent claimers of the claim measure (0: off)"
    )
    parser.add_argument("--claim-runs", type=int, default=20_000)
    parser.add_argument(
        "--against",
        metavar="TREE",
        help="also run each claimd configuration from this source tree (e.g. an export of "
        "main: git archive main | tar -x -C TREE), just before this checkout's",
    )
    parser.add_argument("--against-label", default="before", help="its label in the table")
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile each claimd process while it drains (py-spy, collapsed stacks in DIR)",
    )
    parser.add_argument("--claim-seconds", type=float, default=5.0)
    parser.add_argument(
        "--trace", action="store_true", help="print the runs by state every 250 ms while draining"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

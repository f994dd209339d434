"""The fault-injection harness: replicas under a seeded storm, then the invariants.

``python -m tests.chaos --seed 1 --duration 60 --replicas 3 --jobs 50 [--embedded]``

It starts (or borrows) PostgreSQL and nats-server, runs N ``claimd run``
replicas on a workload of many jobs every second, injects faults on a seeded
plan for a bounded time, lets the system settle, stops the replicas and checks
the invariants (tests/chaos/invariants.py). It prints one table and exits
non-zero when an invariant fails.

Where the servers come from:

* PostgreSQL: ``CLAIMD_TEST_DATABASE_URL`` (a schema of the harness's own,
  dropped afterwards; never restarted, other tests use it), or an embedded
  pgserver with ``--embedded`` or when the variable is absent; only then are
  PostgreSQL restarts injected.
* nats-server: the harness's own (embedded, on a free port), so it can be
  killed and restarted; ``--shared-nats`` uses ``CLAIMD_TEST_NATS_URL``
  instead (a stream of the harness's own, and no nats restarts).

Every replica reaches each server through a fault proxy of its own
(tests/chaos/proxy.py; its URLs are passed in ``CLAIMD_DATABASE_URL`` and
``CLAIMD_NATS_URL``), so a network fault hits one replica's link. The job's
own side effect (``chaos_effects``) and the harness's checks go to PostgreSQL
directly.

Besides the SQL invariants, the run fails when a replica is not live again
within ``LIVENESS_BOUND_S`` after a network fault on its links heals (or after
the faults end), when a SIGTERM stop takes longer than ``STOP_BOUND_S``, and
when a replica exits on its own (it is restarted, as a platform would, and the
exit is reported with the last error its process logged).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import nats

from actors.adapters.embedded import start_nats, start_postgres
from actors.adapters.postgres import PostgresRunStore
from actors.config import load_config
from actors.domain import Job
from tests.chaos.broken import Faults
from tests.chaos.faults import (
    NETWORK_KINDS,
    PROCESS_KINDS,
    REPO_ROOT,
    Fault,
    FaultKind,
    NatsControl,
    PostgresControl,
    ReplicaSet,
    StopRecord,
    build_plan,
)
from tests.chaos.invariants import Report, check_invariants, recovery_seconds
from tests.chaos.proxy import FaultProxy, Mode, Upstream
from tests.chaos.workload import DEFAULT_SLOW_JOB_S, EFFECTS_DDL, EFFECTS_DSN_ENV, SLOW_ENV
from tests.servers import with_search_path

LEASE_S = 6.0
SHUTDOWN_GRACE_S = 5
# Liveness: after a network fault on its links heals, and after the faults end,
# every replica starts a run again within a lease + this margin.
LIVENESS_MARGIN_S = 6.0
LIVENESS_BOUND_S = LEASE_S + LIVENESS_MARGIN_S
# A SIGTERM stop ends within shutdown_grace + the replica's stop margin (15 s:
# then it cancels what is left) + its exit margin (5 s: then it exits at once),
# + 1 s for the harness's polling.
STOP_BOUND_S = SHUTDOWN_GRACE_S + 15.0 + 5.0 + 1.0
SETTINGS = {
    # lease > ack_wait x (max_deliver - 1) x 3 = 3s: recovery after a lost
    # worker takes one short lease.
    "lease": "6s",
    "ack_wait": "1s",
    "max_deliver": 2,
    "http": "off",
    "claim_interval": "200ms",
    "materialize_interval": "1s",
    "reap_interval": "1s",
    "horizon": "30s",
    "shutdown_grace": f"{SHUTDOWN_GRACE_S}s",
    "worker_concurrency": 32,
    "duplicate_window": "1m",
}
BROKEN_BUILDS = {
    # Completions without their epoch guard: a zombie's late completion can
    # overwrite the newer attempt. Built by the harness's own entry point
    # (tests/chaos/broken.py); `claimd run` has no such switch.
    "epoch-guard": Faults(skip_epoch_guard=True),
}
# Log events worth a line in the table (replica logs, JSON lines).
LOG_EVENTS = {
    "completion fenced: the run moved on": "zombie/late completions refused (fenced)",
    "lease lost; cancelling execution": "executions cancelled on a lost lease",
    "lease expired": "leases expired (reaped)",
    "publish failed; runs go to the compensator": "failed publishes (batches) -> compensator",
    "actor crashed; restarting": "actor crashes restarted in-process",
    "actor gave up": "actors that gave up (process exits)",
}
# The run's verdict counts these the same on every build; they are the figures
# the network faults are judged by.


@dataclass
class Options:
    seed: int = 1
    duration: float = 60.0
    replicas: int = 3
    jobs: int = 50
    slow_jobs: int | None = None  # default: a tenth of the jobs
    embedded: bool = False
    shared_nats: bool = False
    kinds: list[FaultKind] | None = None  # default: every kind the servers allow
    force_each: bool = True
    broken_build: str | None = None
    workdir: Path | None = None
    keep: bool = False
    log_level: str = "WARNING"
    settle_timeout: float = 90.0


@dataclass
class FaultRecord:
    fault: Fault
    started: datetime
    ended: datetime  # for a network fault: the heal
    target: str = ""
    recovery_s: float = 0.0
    live_again_s: float | None = None  # network faults: the target's first start after the heal


@dataclass
class Liveness:
    """When a replica started a run again after ``since`` (None: it never did)."""

    replica: str
    after: str
    since: datetime
    live_s: float | None

    @property
    def ok(self) -> bool:
        return self.live_s is not None and self.live_s <= LIVENESS_BOUND_S


@dataclass
class ReplicaLinks:
    """The two proxies in front of one replica."""

    db: FaultProxy
    nats: FaultProxy

    def of(self, which: tuple[str, ...]) -> list[FaultProxy]:
        return [self.db if name == "db" else self.nats for name in which]


@dataclass
class ChaosResult:
    options: Options
    report: Report
    faults: list[FaultRecord]
    skipped: dict[FaultKind, str]
    log_counts: Counter[str]
    unplanned_exits: list[tuple[str, int | None]]
    settings_line: str
    liveness: list[Liveness] = field(default_factory=list)
    stops: list[StopRecord] = field(default_factory=list)
    exit_reasons: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    table: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


def _toml_value(value: object) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def config_text(
    database_url: str, nats_url: str, deployment: str, jobs: int, slow_jobs: int
) -> str:
    lines = [
        "[claimd]",
        f"database_url = {_toml_value(database_url)}",
        f"nats_url = {_toml_value(nats_url)}",
        f"deployment = {_toml_value(deployment)}",
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in SETTINGS.items()]
    for i in range(jobs):
        slow = i < slow_jobs
        name = f"chaos-slow-{i:03d}" if slow else f"chaos-{i:03d}"
        target = "record_effect_slow" if slow else "record_effect"
        lines += [
            "",
            f"[jobs.{name}]",
            'every = "1s"',
            'timeout = "60s"',
            "max_attempts = 5",
            'backoff = { initial = "500ms", max = "2s" }',
            f'run = {{ python = "tests.chaos.workload:{target}" }}',
        ]
    return "\n".join(lines) + "\n"


def database_upstream(url: str) -> Upstream:
    """Where a PostgreSQL URL points: TCP host:port, or the unix socket in ``?host=/dir``."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    port = int(query.get("port") or parts.port or 5432)
    host = query.get("host") or parts.hostname or "127.0.0.1"
    if host.startswith("/"):
        socket_path = Path(host) / f".s.PGSQL.{port}"
        if not socket_path.exists():  # pgserver may pick another port number
            found = sorted(Path(host).glob(".s.PGSQL.*"))
            found = [p for p in found if not p.name.endswith(".lock")]
            if found:
                socket_path = found[0]
        return Upstream(path=socket_path)
    return Upstream(host=host, port=port)


def via_proxy_database(url: str, port: int) -> str:
    """The same PostgreSQL URL, through the proxy on loopback ``port``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")]
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def nats_upstream(url: str) -> Upstream:
    parts = urlsplit(url)
    return Upstream(host=parts.hostname or "127.0.0.1", port=parts.port or 4222)


def via_proxy_nats(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def replica_env(effects_dsn: str) -> dict[str, str]:
    """The harness's environment, minus anything that would steer a replica elsewhere."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("CLAIMD_") and k not in ("CLAIMD_LOG_LEVEL",))
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env[EFFECTS_DSN_ENV] = effects_dsn
    return env


class Harness:
    """One chaos run, from servers up to the verdict."""

    def __init__(self, options: Options, out: TextIO) -> None:
        self.o = options
        self.out = out
        self.stack = contextlib.AsyncExitStack()
        self.pg: PostgresControl | None = None
        self.nats: NatsControl | None = None
        self.replicas: ReplicaSet | None = None
        self.background: set[asyncio.Task[None]] = set()
        self.extra = 0
        self.links: dict[str, ReplicaLinks] = {}
        self.database_url = ""
        self.nats_url = ""
        self.db_server_gives_up = LEASE_S
        self.pool: asyncpg.Pool | None = None

    def say(self, text: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=self.out, flush=True)

    # -- servers ---------------------------------------------------------------------

    def _servers(self, workdir: Path) -> tuple[str, str, dict[FaultKind, str]]:
        skipped: dict[FaultKind, str] = {}
        shared_pg = os.environ.get("CLAIMD_TEST_DATABASE_URL")
        if self.o.embedded or not shared_pg:
            self.pg = PostgresControl(start_postgres(workdir))
            self.stack.callback(self.pg.shutdown)
            base_url = self.pg.server.url
            self.say(f"embedded PostgreSQL in {self.pg.pgdata}")
        else:
            base_url = shared_pg
            skipped[FaultKind.PG_RESTART] = "shared PostgreSQL (other tests use it); use --embedded"
            self.say("PostgreSQL from CLAIMD_TEST_DATABASE_URL (own schema)")
        shared_nats = os.environ.get("CLAIMD_TEST_NATS_URL")
        if self.o.shared_nats and shared_nats:
            nats_url = shared_nats
            skipped[FaultKind.NATS_RESTART] = "shared nats-server (--shared-nats)"
            self.say("nats-server from CLAIMD_TEST_NATS_URL (own stream)")
        else:
            server = start_nats(workdir)
            self.nats = NatsControl(server)
            self.stack.callback(server.stop)
            nats_url = server.url
            self.say(f"own nats-server at {nats_url}")
        return base_url, nats_url, skipped

    async def _schema(self, base_url: str, schema: str) -> str:
        conn = await asyncpg.connect(base_url)
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            await conn.close()

        async def drop() -> None:
            if self.o.keep:
                self.say(f"kept schema {schema}")
                return
            with contextlib.suppress(Exception):
                c = await asyncpg.connect(base_url, timeout=10)
                try:
                    await c.execute(f'DROP SCHEMA "{schema}" CASCADE')
                finally:
                    await c.close()

        self.stack.push_async_callback(drop)
        url = with_search_path(base_url, schema)
        store = await PostgresRunStore.connect(url, max_size=2)
        try:
            await store.migrate()
            await store.pool.execute(EFFECTS_DDL)
        finally:
            await store.close()
        return url

    # -- the run ---------------------------------------------------------------------

    async def run(self) -> ChaosResult:
        async with self.stack:
            return await self._run()

    async def _run(self) -> ChaosResult:
        o = self.o
        workdir = o.workdir or Path(tempfile.mkdtemp(prefix="claimd-chaos-"))
        workdir.mkdir(parents=True, exist_ok=True)
        if o.workdir is None and not o.keep:
            self.stack.callback(shutil.rmtree, workdir, True)
        base_url, nats_url, skipped = self._servers(workdir)
        name = f"chaos_{uuid.uuid4().hex[:10]}"
        url = await self._schema(base_url, name)
        if self.nats is None:
            self.stack.push_async_callback(_delete_stream, nats_url, f"CLAIMD_{name}")
        slow_jobs = o.jobs // 10 if o.slow_jobs is None else o.slow_jobs
        config = workdir / "claimd.toml"
        config.write_text(config_text(url, nats_url, name, o.jobs, slow_jobs))
        loaded = load_config(config, env={})
        loaded.raise_for_errors()
        # A caught connection's server end is freed when the server would notice:
        # PostgreSQL by the TCP keepalive claimd asks of it; nats-server (its own
        # pings, minutes by default) after a lease.
        self.db_server_gives_up = loaded.settings.timeouts.database_dead_after().total_seconds()
        kinds = [k for k in (o.kinds or list(FaultKind)) if k not in skipped]
        plan = build_plan(o.seed, kinds, o.duration, o.replicas, LEASE_S, force_each=o.force_each)
        settings_line = (
            f"seed={o.seed} duration={o.duration:g}s replicas={o.replicas} "
            f"jobs={o.jobs} every 1s ({slow_jobs} slow) lease=6s ack_wait=1s "
            f"max_deliver=2 postgres={'embedded' if self.pg else 'shared'} "
            f"nats={'own' if self.nats else 'shared'}"
            + (f" BROKEN BUILD={o.broken_build}" if o.broken_build else "")
        )
        self.say(settings_line)
        self.say(f"plan ({len(plan)} faults):")
        for fault in plan:
            self.say(f"  {fault.describe()}")

        logs = workdir / "logs"
        logs.mkdir(exist_ok=True)
        self.database_url, self.nats_url = url, nats_url
        self.replicas = ReplicaSet(
            config,
            logs,
            replica_env(url),
            o.log_level,
            BROKEN_BUILDS[o.broken_build] if o.broken_build else None,
        )
        self.stack.callback(self.replicas.kill_all)
        for i in range(o.replicas):
            await self._add_replica(f"r{i}")
        self.replicas.start_watching()
        self.say(f"{o.replicas} replicas starting, each through its own proxies; logs in {logs}")

        pool = await asyncpg.create_pool(url, min_size=0, max_size=2)
        assert pool is not None
        self.pool = pool
        self.stack.push_async_callback(pool.close)
        await self._wait_ready(pool, len(loaded.jobs))
        window_start: datetime = await pool.fetchval("SELECT now()")
        self.say("steady; injecting faults")
        records = await self._inject(plan)
        faults_over = datetime.now().astimezone()
        window_end: datetime = await self._fetch_now(pool)
        self.say("injection over; settling")
        await self._settle(pool, loaded.jobs, window_start, window_end)
        for task in list(self.background):
            await task
        stopping = [n for n, r in self.replicas.replicas.items() if r.alive and not r.retired]
        await self.replicas.stop_all(timeout=STOP_BOUND_S + 10)
        self.say(
            "replicas stopped: "
            + ", ".join(
                f"{s.replica} {s.seconds:.1f}s" + (" (SIGKILLed)" if s.killed else "")
                for s in self.replicas.stops
                if s.replica in stopping and s.during == "end of run"
            )
        )
        self.say("checking invariants")
        report = await check_invariants(pool, loaded.jobs, window_start, window_end)
        work = {
            name: timedelta(seconds=DEFAULT_SLOW_JOB_S + 0.5 if "slow" in name else 0.5)
            for name in loaded.jobs
        }
        recovery = recovery_seconds(report.runs, [r.started for r in records], work)
        for record, seconds in zip(records, recovery, strict=True):
            record.recovery_s = seconds
        liveness = await self._liveness(pool, records, faults_over, o.replicas)
        result = ChaosResult(
            options=o,
            report=report,
            faults=records,
            skipped=skipped,
            log_counts=count_log_events(logs),
            unplanned_exits=[(u.replica, u.code) for u in self.replicas.unplanned],
            settings_line=settings_line,
            liveness=liveness,
            stops=list(self.replicas.stops),
            exit_reasons=[
                f"{u.replica} exit {u.code} at {u.at.isoformat(timespec='seconds')}: "
                f"{u.last_error or '(nothing logged)'}"
                for u in self.replicas.unplanned
            ],
        )
        result.failures = report.failures() + harness_failures(result)
        result.table = render_table(result)
        print(result.table, file=self.out, flush=True)
        if o.keep:
            self.say(f"kept {workdir}")
        return result

    async def _add_replica(
        self, name: str, env: dict[str, str] | None = None, faults: Faults | None = None
    ) -> None:
        """A replica slot with its own proxy in front of each server (kept across restarts)."""
        assert self.replicas is not None
        links = self.links.get(name)
        if links is None:
            db = await FaultProxy(
                f"{name}-db",
                database_upstream(self.database_url),
                server_gives_up=self.db_server_gives_up,
            ).start()
            nats_proxy = await FaultProxy(
                f"{name}-nats", nats_upstream(self.nats_url), server_gives_up=LEASE_S
            ).start()
            links = self.links[name] = ReplicaLinks(db, nats_proxy)
            self.stack.push_async_callback(db.close)
            self.stack.push_async_callback(nats_proxy.close)
        self.replicas.add(
            name,
            {
                "CLAIMD_DATABASE_URL": via_proxy_database(self.database_url, links.db.port),
                "CLAIMD_NATS_URL": via_proxy_nats(self.nats_url, links.nats.port),
                **(env or {}),
            },
            faults,
        )

    async def _first_start(
        self, pool: asyncpg.Pool, pids: list[int], since: datetime
    ) -> datetime | None:
        began: datetime | None = await pool.fetchval(
            "SELECT min(began_at) FROM chaos_effects WHERE began_at > $1 AND pid = ANY($2)",
            since,
            pids,
        )
        return began

    async def _liveness(
        self, pool: asyncpg.Pool, records: list[FaultRecord], faults_over: datetime, replicas: int
    ) -> list[Liveness]:
        """Per network fault, its target after the heal; then every replica after the end."""
        assert self.replicas is not None
        out = []
        for record in records:
            kind = record.fault.kind
            if not kind.network or kind is FaultKind.STOP_BLACKHOLED:
                continue
            slot = self.replicas.replicas[record.target]
            began = await self._first_start(pool, slot.pids, record.ended)
            live = None if began is None else (began - record.ended).total_seconds()
            record.live_again_s = live
            out.append(Liveness(record.target, record.fault.describe().strip(), record.ended, live))
        for i in range(replicas):
            slot = self.replicas.replicas[f"r{i}"]
            began = await self._first_start(pool, slot.pids, faults_over)
            out.append(
                Liveness(
                    slot.name,
                    "the end of the faults",
                    faults_over,
                    None if began is None else (began - faults_over).total_seconds(),
                )
            )
        return out

    async def _fetch_now(self, pool: asyncpg.Pool) -> datetime:
        """The database's clock; retried, since the last fault may have just ended."""
        deadline = time.monotonic() + 60
        while True:
            try:
                now: datetime = await pool.fetchval("SELECT now()")
                return now
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _wait_ready(self, pool: asyncpg.Pool, jobs: int) -> None:
        """Until every job is materialized and runs are being recorded."""
        deadline = time.monotonic() + 90
        while True:
            row = await pool.fetchrow(
                "SELECT (SELECT count(*) FROM jobs WHERE materialized_until IS NOT NULL) AS j,"
                " (SELECT count(*) FROM job_runs WHERE state = 'succeeded') AS s"
            )
            assert row is not None
            if row["j"] >= jobs and row["s"] >= jobs:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas not steady after 90s: {dict(row)}; see the logs")
            await asyncio.sleep(0.5)

    async def _settle(
        self, pool: asyncpg.Pool, jobs: dict[str, Job], start: datetime, end: datetime
    ) -> None:
        """At least lease + margin; then until the window's runs are terminal (bounded)."""
        await asyncio.sleep(LEASE_S + 3)
        deadline = time.monotonic() + self.o.settle_timeout
        while time.monotonic() < deadline:
            open_runs = await pool.fetchval(
                "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE r.scheduled_at > $1 AND r.scheduled_at <= $2"
                " AND j.name = ANY($3::text[])"
                " AND r.state NOT IN ('succeeded', 'failed', 'skipped', 'cancelled')",
                start,
                end,
                sorted(jobs),
            )
            if open_runs == 0:
                return
            await asyncio.sleep(0.5)
        self.say(f"settle deadline passed with runs still open ({self.o.settle_timeout:g}s)")

    # -- faults ----------------------------------------------------------------------

    async def _inject(self, plan: list[Fault]) -> list[FaultRecord]:
        records = []
        t0 = time.monotonic()
        for fault in plan:
            await asyncio.sleep(max(0.0, t0 + fault.at - time.monotonic()))
            started = datetime.now().astimezone()
            target = await self._apply(fault)
            ended = datetime.now().astimezone()
            records.append(FaultRecord(fault, started, ended, target))
            self.say(f"{fault.describe()} -> {target}")
        await asyncio.sleep(max(0.0, t0 + self.o.duration - time.monotonic()))
        return records

    def _target(self, index: int) -> str:
        """The planned replica, or the next one alive if it is down."""
        assert self.replicas is not None
        n = self.o.replicas
        for k in range(n):
            name = f"r{(index + k) % n}"
            if self.replicas.replicas[name].alive:
                return name
        return f"r{index}"

    async def _apply(self, fault: Fault) -> str:
        replicas = self.replicas
        assert replicas is not None
        if fault.kind is FaultKind.KILL:
            name = self._target(fault.target)
            replicas.kill(name)
            await asyncio.sleep(fault.span)
            if not replicas.replicas[name].alive:
                replicas.spawn(replicas.replicas[name])
            return name
        if fault.kind is FaultKind.ZOMBIE:
            name = self._target(fault.target)
            replicas.signal(name, signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.span)
            finally:
                replicas.signal(name, signal.SIGCONT)
            return name
        if fault.kind is FaultKind.NATS_RESTART:
            assert self.nats is not None
            self.nats.kill()
            await asyncio.sleep(fault.span)
            await asyncio.to_thread(self.nats.start)
            return "nats-server"
        if fault.kind is FaultKind.PG_RESTART:
            assert self.pg is not None
            await asyncio.to_thread(self.pg.stop)
            await asyncio.sleep(fault.span)
            await asyncio.to_thread(self.pg.start)
            return "postgres"
        if fault.kind.network:
            return await self._apply_network(fault)
        # An extra replica: on the run's build, failing every Nth publish, or
        # with slow completions (the workload's job reads CLAIMD_CHAOS_SLOW_S).
        env: dict[str, str] = {}
        faults: Faults | None = None
        if fault.kind is FaultKind.PUBLISH_FAILURES:
            faults = dataclasses.replace(replicas.faults, publish_fail_every=int(fault.param))
        else:
            env = {SLOW_ENV: f"{fault.param:.2f}"}
        self.extra += 1
        name = f"x{self.extra}"
        await self._add_replica(name, env, faults)
        await asyncio.sleep(fault.span)
        # Graceful stop in the background: the plan goes on while it drains.
        self._background(replicas.retire(name, timeout=STOP_BOUND_S + 10, during=fault.kind.label))
        return name

    def _background(self, work: Coroutine[Any, Any, object]) -> None:
        async def run() -> None:
            await work

        task = asyncio.create_task(run())
        self.background.add(task)

    async def _apply_network(self, fault: Fault) -> str:
        """Blackhole, reset or slow the target's links; back to pass at the end of the span."""
        if fault.kind is FaultKind.STOP_BLACKHOLED:
            return await self._stop_blackholed(fault)
        name = self._target(fault.target)
        proxies = self.links[name].of(fault.kind.links)
        try:
            if fault.kind is FaultKind.LINK_RESETS:
                end = time.monotonic() + fault.span
                while time.monotonic() < end:
                    for proxy in proxies:
                        proxy.reset_all()
                    await asyncio.sleep(min(fault.param, max(0.0, end - time.monotonic())))
            else:
                mode = Mode.SLOW if fault.kind is FaultKind.LINK_SLOW else Mode.BLACKHOLE
                for proxy in proxies:
                    proxy.set_mode(mode, latency=fault.param)
                await asyncio.sleep(fault.span)
        finally:
            for proxy in proxies:
                proxy.set_mode(Mode.PASS)  # the heal; caught connections stay dead
        return name

    async def _stop_blackholed(self, fault: Fault) -> str:
        """An extra replica, once it executes runs, loses both links and gets a SIGTERM.

        Its stop must end within the bound whatever the network does; its runs
        in flight are left to their leases.
        """
        assert self.replicas is not None
        assert self.pool is not None
        self.extra += 1
        name = f"x{self.extra}"
        await self._add_replica(name)
        pool, replicas, links = self.pool, self.replicas, self.links[name]

        async def blackhole_then_stop() -> None:
            slot = replicas.replicas[name]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and slot.alive:
                if await self._first_start(pool, slot.pids, datetime.fromtimestamp(0).astimezone()):
                    break
                await asyncio.sleep(0.2)
            for proxy in links.of(("db", "nats")):
                proxy.set_mode(Mode.BLACKHOLE)
            try:
                await asyncio.sleep(fault.param)
                record = await replicas.retire(
                    name, timeout=STOP_BOUND_S + 10, during=fault.kind.label
                )
                if record is not None:
                    self.say(
                        f"{name} stopped {record.seconds:.1f}s after SIGTERM while "
                        "blackholed" + (" (SIGKILLed)" if record.killed else "")
                    )
            finally:
                for proxy in links.of(("db", "nats")):
                    proxy.set_mode(Mode.PASS)

        self._background(blackhole_then_stop())
        await asyncio.sleep(fault.span)
        return name


async def _delete_stream(nats_url: str, stream: str) -> None:
    """Leave the shared nats-server as found."""
    with contextlib.suppress(Exception):
        nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=1)
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()


# --- reporting -------------------------------------------------------------------------


def count_log_events(logs: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in sorted(logs.glob("*.log")):
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line).get("event", "")
                except ValueError:
                    continue
                if event in LOG_EVENTS:
                    counts[event] += 1
    return counts


def _p50_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):5.1f}s / {max(values):5.1f}s"


def _p50_max_or_never(values: list[float | None]) -> str:
    seen = [v for v in values if v is not None]
    never = len(values) - len(seen)
    text = _p50_max(seen)
    return text + (f", {never} never" if never else "")


EXIT_REASONS_SHOWN = 5


def harness_failures(result: ChaosResult) -> list[str]:
    """What the harness itself saw fail: liveness, bounded stops, unplanned exits."""
    out = []
    for v in result.liveness:
        if not v.ok:
            when = (
                "started no run" if v.live_s is None else f"started its first run {v.live_s:.1f}s"
            )
            out.append(
                f"(6) replica {v.replica} {when} after {v.after} (bound {LIVENESS_BOUND_S:g}s)"
            )
    for stop in result.stops:
        if stop.killed or stop.seconds > STOP_BOUND_S:
            how = "did not stop and was SIGKILLed" if stop.killed else "stopped"
            out.append(
                f"(7) replica {stop.replica} {how} {stop.seconds:.1f}s after SIGTERM "
                f"({stop.during}; bound {STOP_BOUND_S:g}s)"
            )
    for reason in result.exit_reasons:
        out.append(f"(8) replica exited on its own: {reason}")
    return out


def render_table(result: ChaosResult) -> str:
    r = result.report
    lines = [
        f"claimd chaos: {result.settings_line}",
        f"window {r.window_start.isoformat(timespec='seconds')} .. "
        f"{r.window_end.isoformat(timespec='seconds')} "
        f"({(r.window_end - r.window_start).total_seconds():.0f}s)",
        "",
    ]
    lines.append(f"{'fault':<48} {'injected':>8}   recovery p50 / max")
    by_kind: dict[FaultKind, list[FaultRecord]] = {k: [] for k in FaultKind}
    for record in result.faults:
        by_kind[record.fault.kind].append(record)
    for kind in FaultKind:
        if kind in result.skipped:
            lines.append(f"{kind.label:<48} {'skipped':>8}   {result.skipped[kind]}")
            continue
        done = by_kind[kind]
        lines.append(f"{kind.label:<48} {len(done):>8}   {_p50_max([d.recovery_s for d in done])}")
    lines.append("")

    def row(label: str, value: object, note: str = "") -> None:
        lines.append(f"{label:<48} {value!s:>8}   {note}".rstrip())

    states = ", ".join(f"{k} {v}" for k, v in sorted(r.states.items()))
    row("runs due in window", r.due)
    row("runs recorded", r.recorded, states)
    row(
        "lost (must be 0)",
        r.lost,
        f"missing {r.missing}, not terminal {r.non_terminal}, "
        f"succeeded without effect {r.lost_work}",
    )
    row(
        "doubled records (must be 0)",
        r.doubled,
        f"instants with >1 row {r.doubled_rows}, runs succeeded twice {r.succeeded_twice}",
    )
    row(
        "fencing violations (must be 0)",
        r.fencing_violations,
        "success on record not the work of the latest claim",
    )
    row(
        "inconsistent attempts (must be 0)",
        r.inconsistent + r.unexpected,
        f"unexpected instants {r.unexpected}",
    )
    row("failed runs (terminal, attempts exhausted)", r.failed_work)
    row(
        "duplicate executions (keys run >1 time)",
        r.duplicate_keys,
        f"{r.extra_executions} extra executions: {r.duplicates_new_claim} re-run under a "
        f"newer claim, {r.duplicates_same_claim} twice under one claim",
    )
    for event, label in LOG_EVENTS.items():
        row(f"  {label}", result.log_counts.get(event, 0))
    exits = Counter(code for _, code in result.unplanned_exits)
    row(
        "unplanned replica exits (must be 0)",
        len(result.unplanned_exits),
        ", ".join(f"exit {c}: {n}" for c, n in sorted(exits.items(), key=str)),
    )
    for reason in result.exit_reasons[:EXIT_REASONS_SHOWN]:
        lines.append(f"  {reason}")
    after_fault = [v for v in result.liveness if v.after != "the end of the faults"]
    at_end = [v for v in result.liveness if v.after == "the end of the faults"]
    late = sum(not v.ok for v in result.liveness)
    row(
        f"not live within {LIVENESS_BOUND_S:g}s (must be 0)",
        late,
        f"lease {LEASE_S:g}s + {LIVENESS_MARGIN_S:g}s, from each network fault's heal "
        "(its replica) and from the end of the faults (every replica)",
    )
    row(
        "  live again after a heal, p50 / max",
        len(after_fault),
        _p50_max_or_never([v.live_s for v in after_fault]),
    )
    row(
        "  live again after the end, p50 / max",
        len(at_end),
        _p50_max_or_never([v.live_s for v in at_end]),
    )
    over = [s for s in result.stops if s.killed or s.seconds > STOP_BOUND_S]
    row(
        f"SIGTERM stops over {STOP_BOUND_S:g}s (must be 0)",
        len(over),
        f"of {len(result.stops)} timed; p50 / max {_p50_max([s.seconds for s in result.stops])}"
        + (f"; {sum(s.killed for s in result.stops)} SIGKILLed" if over else ""),
    )
    blackholed = [s for s in result.stops if s.during == FaultKind.STOP_BLACKHOLED.label]
    if blackholed:
        row(
            "  of which while blackholed, p50 / max",
            len(blackholed),
            _p50_max([s.seconds for s in blackholed]),
        )
    lines.append("")
    lines += [
        "duplicate executions: the price of at-least-once delivery. A worker killed or paused",
        "  after doing the work but before recording it loses its lease; the run is executed",
        "  again under a newer claim, the late completion is refused by the epoch guard, and",
        "  both executions saw the same idempotency key (the run id), so the work can dedupe.",
        "recovery: from the fault until the last run it delayed (by >2s) began executing;",
        "  0 = no run delayed. A late run is charged to the last fault begun before it was",
        "  due to finish.",
    ]
    for what, examples in sorted(r.examples.items()):
        for example in examples:
            lines.append(f"  e.g. {what}: {example}")
    lines.append("")
    if result.failures:
        lines.append("RESULT: FAIL")
        lines += [f"  {f}" for f in result.failures]
    else:
        lines.append(
            "RESULT: PASS (every due instant recorded once, terminal, fenced; "
            "every replica live again and stopped within its bound)"
        )
    return "\n".join(lines)


# --- entry point -----------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of fault injection")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--jobs", type=int, default=50, help="jobs, each every 1s")
    p.add_argument(
        "--slow-jobs",
        type=int,
        default=None,
        help="how many of the jobs work 3s (default: a tenth)",
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="own embedded PostgreSQL (enables PostgreSQL restarts)",
    )
    p.add_argument(
        "--shared-nats",
        action="store_true",
        help="use CLAIMD_TEST_NATS_URL instead of an own nats-server",
    )
    p.add_argument(
        "--faults",
        default=None,
        help="comma-separated kinds (or the groups 'process', 'network'): "
        + ",".join(k.value for k in FaultKind),
    )
    p.add_argument(
        "--no-force-each",
        action="store_true",
        help="do not force one fault of each kind into the plan",
    )
    p.add_argument(
        "--broken-build",
        choices=sorted(BROKEN_BUILDS),
        help="run replicas with a deliberately broken guard (the harness must fail)",
    )
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the workdir, logs and schema")
    p.add_argument("--log-level", default="WARNING", help="replicas' log level")
    a = p.parse_args(argv)
    return Options(
        seed=a.seed,
        duration=a.duration,
        replicas=a.replicas,
        jobs=a.jobs,
        slow_jobs=a.slow_jobs,
        embedded=a.embedded,
        shared_nats=a.shared_nats,
        kinds=parse_kinds(a.faults) if a.faults else None,
        force_each=not a.no_force_each,
        broken_build=a.broken_build,
        workdir=a.workdir,
        keep=a.keep,
        log_level=a.log_level,
    )


def parse_kinds(text: str) -> list[FaultKind]:
    kinds: list[FaultKind] = []
    for name in (n.strip() for n in text.split(",")):
        group = {"process": PROCESS_KINDS, "network": NETWORK_KINDS}.get(name)
        kinds += group if group is not None else [FaultKind(name)]
    return list(dict.fromkeys(kinds))


async def run_chaos(options: Options, out: TextIO | None = None) -> ChaosResult:
    """Run the harness; the result carries the report, the table and the verdict."""
    return await Harness(options, out or sys.stdout).run()


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every invariant holds, 1 when one fails, 2 when the harness broke."""
    options = parse_args(argv)
    try:
        result = asyncio.run(run_chaos(options))
    except Exception:  # noqa: BLE001 - a harness failure is not a verdict
        traceback.print_exc()
        print("chaos harness error (no verdict)", file=sys.stderr)
        return 2
    return 0 if result.ok else 1

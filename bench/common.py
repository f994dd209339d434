"""What the benchmarks share: the servers, a private schema and stream, seeding, tables.

Every benchmark runs against the real servers named by ``CLAIMD_TEST_DATABASE_URL``
and ``CLAIMD_TEST_NATS_URL`` (the defaults are the ones ``.ci/run`` uses), in a
schema and a JetStream stream of its own that it drops afterwards. Figures are
printed, never asserted: this machine is shared and timings are noisy.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import asyncpg
import nats
from nats.js.errors import NotFoundError

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig, parse_config
from actors.domain import RunContext
from tests.servers import unique_name, with_search_path

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
REPO = Path(__file__).resolve().parents[1]
# A configuration measured in a subprocess of its own (so its peak RSS and CPU
# are its own) prints its result as one line after this marker.
RESULT_MARKER = "BENCH_RESULT "


def database_url() -> str:
    return os.environ.get("CLAIMD_TEST_DATABASE_URL") or DEFAULT_DATABASE_URL


def nats_url() -> str:
    return os.environ.get("CLAIMD_TEST_NATS_URL") or DEFAULT_NATS_URL


# --- job functions the end-to-end benchmark runs ------------------------------------------


def noop(ctx: RunContext) -> None:
    """A sync python job that does nothing (run in a child process, like any sync job)."""


async def anoop(ctx: RunContext) -> None:
    """An async python job that does nothing (runs on a job event loop in the replica)."""


# --- a private schema and stream ----------------------------------------------------------


@asynccontextmanager
async def bench_schema(prefix: str = "bench_") -> AsyncIterator[str]:
    """A database URL confined to a fresh schema, dropped afterwards."""
    base = database_url()
    schema = unique_name(prefix)
    conn = await asyncpg.connect(base)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    try:
        yield with_search_path(base, schema)
    finally:
        conn = await asyncpg.connect(base)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()


@asynccontextmanager
async def migrated_store(schema_url: str, max_size: int = 10) -> AsyncIterator[PostgresRunStore]:
    store = await PostgresRunStore.connect(schema_url, min_size=1, max_size=max_size)
    try:
        await store.migrate()
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def bench_stream(prefix: str = "bench") -> AsyncIterator[JetStreamBroker]:
    """A connected broker on a stream of its own (no consumer), deleted afterwards."""
    deployment = unique_name(prefix)
    broker = await JetStreamBroker.connect(
        nats_url(), f"CLAIMD_{deployment}", f"claimd.{deployment}.runs", name="claimd-bench"
    )
    try:
        await broker.ensure_stream(timedelta(minutes=2))
        yield broker
    finally:
        try:
            await broker.js.delete_stream(broker.stream)
        finally:
            await broker.close()


# --- configs and rows ---------------------------------------------------------------------


def jobs_toml(
    n_jobs: int, *, every: str = "1s", target: str = "bench.common:noop", prefix: str = "job"
) -> str:
    """``n_jobs`` interval jobs running a python function."""
    return "\n".join(
        textwrap.dedent(f"""
            [jobs.{prefix}-{i:05d}]
            every = "{every}"
            timeout = "30s"
            run = {{ python = "{target}" }}
        """)
        for i in range(n_jobs)
    )


def config_toml(schema_url: str, deployment: str, jobs: str, **settings: object) -> str:
    """The config file's text for the benchmark's schema and stream."""
    lines = [
        f'database_url = "{schema_url}"',
        f'nats_url = "{nats_url()}"',
        f'deployment = "{deployment}"',
        'http = "off"',
    ]
    for key, value in settings.items():
        if isinstance(value, bool):  # TOML's booleans are lower case
            lines.append(f"{key} = {str(value).lower()}")
        else:
            lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value!r}")
    return "[claimd]\n" + "\n".join(lines) + "\n" + jobs


def make_config(schema_url: str, deployment: str, jobs: str, **settings: object) -> LoadedConfig:
    """A LoadedConfig for the benchmark's schema and stream (the tests' make_config)."""
    return parse_config(config_toml(schema_url, deployment, jobs, **settings), "<bench>", env={})


async def seed_jobs(store: PostgresRunStore, n_jobs: int) -> list[int]:
    """Insert ``n_jobs`` jobs through the store, as a replica would; their ids."""
    loaded = parse_config(jobs_toml(n_jobs), "<bench>", env={})
    await store.sync_jobs(list(loaded.jobs.values()))
    return sorted(s.id for s in (await store.active_jobs()).values())


SEED_DUE_RUNS = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT j, now() - interval '1 day' + g * interval '1 second',
          now() - interval '1 day' + g * interval '1 second'
  FROM unnest($1::bigint[]) AS j, generate_series(1, $2::int) AS g
"""


async def reseed_due_runs(store: PostgresRunStore, job_ids: Sequence[int], per_job: int) -> int:
    """Empty the run tables and insert ``per_job`` pending, already-due runs per job."""
    async with store.pool.acquire() as conn:
        await conn.execute("TRUNCATE job_runs CASCADE")
        status = await conn.execute(SEED_DUE_RUNS, list(job_ids), per_job)
        await conn.execute("VACUUM ANALYZE job_runs")
    return int(status.split()[-1])


# --- environment and tables ---------------------------------------------------------------


async def environment(pool: Any = None, broker: JetStreamBroker | None = None) -> str:
    """One line naming the machine and the server versions the figures came from."""
    parts = [f"{os.cpu_count()} cores", f"Python {platform.python_version()}"]
    if pool is not None:
        version = await pool.fetchval("SHOW server_version")
        parts.append(f"PostgreSQL {str(version).split()[0]}")
    if broker is not None:
        v = broker.nc.connected_server_version
        parts.append(f"NATS {v.major}.{v.minor}.{v.patch}")
    return ", ".join(parts)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


@dataclass(frozen=True)
class Row:
    """One line of a result table: a figure, its naive baseline, and which way is better."""

    name: str
    figure: float
    baseline: float | None
    unit: str
    higher_is_better: bool = True
    compared: bool = True  # False: shown for information, no ratio

    @property
    def ratio(self) -> str:
        if not self.compared or not self.baseline or not self.figure or self.figure != self.figure:
            return "-"
        r = self.figure / self.baseline if self.higher_is_better else self.baseline / self.figure
        return f"{r:.1f}x"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def print_table(title: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> None:
    """A small fixed-width table; a ratio > 1 means the figure beats the baseline."""
    header = ("name", "figure", "baseline", "ratio", "unit")
    body = [(r.name, _fmt(r.figure), _fmt(r.baseline), r.ratio, r.unit) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    print(f"\n{title}")
    line = "  ".join(
        h.ljust(w) if i in (0, 4) else h.rjust(w)
        for i, (h, w) in enumerate(zip(header, widths, strict=True))
    )
    print(line)
    print("-" * len(line))
    for b in body:
        print(
            "  ".join(
                c.ljust(w) if i in (0, 4) else c.rjust(w)
                for i, (c, w) in enumerate(zip(b, widths, strict=True))
            )
        )
    for note in notes:
        print(f"  {note}")


# --- configurations in subprocesses of their own -------------------------------------------


def child_env() -> dict[str, str]:
    """No server overrides leaking into the replicas from ours (`claimd` has no fault switch)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("CLAIMD_DATABASE_URL", "CLAIMD_NATS_URL")
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    """Signal each process we started; kill the ones still running a minute later."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port() -> int:
    """A free loopback TCP port (for a replica's HTTP face)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """A live process's resident set in MB (Linux /proc); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def print_result(result: dict[str, Any]) -> None:
    """The child's side: its result, one JSON line the parent finds."""
    print(RESULT_MARKER + json.dumps(result, default=str), flush=True)


def run_child(
    module: str,
    flags: Sequence[str],
    *,
    timeout: float,
    what: str,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``python -m module --child *flags`` from the repository root; its result."""
    proc = subprocess.run(
        [sys.executable, "-m", module, "--child", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=env,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            return dict(json.loads(line[len(RESULT_MARKER) :]))
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    raise RuntimeError(f"{what} produced no result (exit {proc.returncode})")


async def delete_stream(stream: str) -> str:
    """Delete a stream a replica created, if it did; returns the NATS server's version."""
    nc = await nats.connect(nats_url(), name="claimd-bench")
    try:
        with contextlib.suppress(NotFoundError):
            await nc.jetstream().delete_stream(stream)
        v = nc.connected_server_version
        return f"{v.major}.{v.minor}.{v.patch}"
    finally:
        await nc.close()


# The sync python jobs the warm-pool benches run (bench_python_pool, bench_warm_child):
# a module written to a temporary folder, importable by the fork server's children.
SYNC_JOBS_SOURCE = """def noop(ctx):
    pass


def talk(ctx):
    print("one line from attempt", ctx.attempt)
"""


def rounds_against(
    script: str, against: str, rounds: int, module: str, args: Sequence[str]
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each round, the baseline's tree then this one: ``script --inner ARGS`` in a process
    of its own with that tree (and a folder holding the jobs module ``module``) first on
    ``PYTHONPATH``; yields (round, label, the JSON of its last line of output).

    For the outer process only: the inner one runs with the baseline's tree first on
    its path, where this helper may not exist.
    """
    trees = {"this tree": str(REPO), "baseline": str(Path(against).resolve())}
    with TemporaryDirectory() as jobs_dir:
        Path(jobs_dir, f"{module}.py").write_text(SYNC_JOBS_SOURCE)
        print(f"load average before: {os.getloadavg()}  (cpus: {os.cpu_count()})")
        for round_ in range(1, rounds + 1):
            for label in ("baseline", "this tree"):
                done = subprocess.run(
                    [sys.executable, script, "--inner", *args],
                    env={**os.environ, "PYTHONPATH": os.pathsep.join([trees[label], jobs_dir])},
                    cwd=jobs_dir,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                yield round_, label, json.loads(done.stdout.strip().splitlines()[-1])
        print(f"load average after: {os.getloadavg()}")

"""Per-tick database cost of one replica at 10, 500 and 5,000 jobs (pg_stat_statements).

Every statement a replica runs on a timer (the claimer's skip pass, in-flight
count and two claims every ``claim_interval``; the materializer every second;
the reaper; the heartbeat; the cluster figures /metrics reads, here every
``--scrape-every`` seconds) should cost the
same whatever the number of jobs and the size of the materialized horizon:
each one touches only the rows that can change its answer. This benchmark runs
a real ``actors.replica.Replica`` per job count, each in a subprocess of its own,
against a PRIVATE PostgreSQL started for it (pg_stat_statements needs
``shared_preload_libraries``, which the shared server is not asked to change),
and the shared NATS. After the horizon is materialized and a warm-up, the
statistics are reset; after the measured window, every statement is printed
with calls/s, mean ms and total ms/s, beside the same statement at the other
job counts. The line to read is the per-tick statements' ms/s: flat means the
cost does not grow with jobs x horizon.

Also: database CPU (the PostgreSQL processes' user + system time) per second
and per recorded run, and, with ``--big``, a replica with 10,000 jobs (half
every minute, half daily): its materializer tick times and its peak RSS.

    python -m bench.bench_tick_cost                      # ~3 min
    python -m bench.bench_tick_cost --jobs 10,500 --duration 10 --big 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres import statements as statement_package
from actors.domain import parse_duration
from actors.observability import configure_logging
from actors.replica import Replica
from actors.scheduling.materializer import Materializer
from bench.common import (
    bench_schema,
    delete_stream,
    environment,
    jobs_toml,
    make_config,
    percentile,
    print_result,
    run_child,
)
from tests.servers import PrivatePostgres, postgres_bindir, unique_name

PG_SETTINGS = (
    "shared_preload_libraries = 'pg_stat_statements'\n"
    "pg_stat_statements.max = 1000\n"
    "pg_stat_statements.track = top\n"
    "track_io_timing = on\n"
)
# The statements that run on a timer whatever the work: their cost must not
# follow the number of jobs or the horizon.
PER_TICK = (
    "SKIP_UNRUNNABLE",
    "COUNT_CLAIMED",
    "CLAIM_DUE_RUNS",
    "CLAIM_EXCLUSIVE_RUNS",
    "NEXT_DUE_IN",
    "CANCEL_ORPHANED_RUNS",
    "LOCK_EXPIRED_LEASES",
    "PRUNE_HISTORY",
    "CLUSTER_JOB_FIGURES",
    "CLUSTER_LEASE_FIGURES",
)

STATEMENTS = """
SELECT query, calls, total_exec_time, rows, shared_blks_hit + shared_blks_read AS blocks,
       jit_generation_time + jit_inlining_time + jit_optimization_time + jit_emission_time
           AS jit_ms
  FROM public.pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _normalize(sql: str) -> str:
    """A statement's shape: pg_stat_statements turns constants into $n, so both do."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"'(?:[^']|'')*'", "?", sql)
    sql = re.sub(r"\$\d+", "?", sql)
    sql = re.sub(r"\b\d+(?:\.\d+)?\b", "?", sql)
    return re.sub(r"\s+", " ", sql).strip().lower()


def _known_statements() -> dict[str, str]:
    """The normalized text of every statement claimd defines, to its constant's name."""
    known: dict[str, str] = {}
    for module in ("claim", "jobs", "materialize", "metrics", "operator", "reaper", "worker"):
        mod = __import__(f"{statement_package.__name__}.{module}", fromlist=["_"])
        for name, value in vars(mod).items():
            if name.isupper() and isinstance(value, str) and len(value) > 10:
                known.setdefault(_normalize(value), name)
    return known


def _name(query: str, known: dict[str, str]) -> str:
    shape = _normalize(query)
    if shape in known:
        return known[shape]
    # pg_stat_statements keeps the text of the statement's first call; a
    # statement assembled at run time (a variant of a constant) matches by
    # its longest common start with one.
    best, length = "", 0
    for text, name in known.items():
        n = next(
            (i for i, (a, b) in enumerate(zip(text, shape, strict=False)) if a != b),
            min(len(text), len(shape)),
        )
        if n > length:
            best, length = name, n
    return best if length >= 60 else "? " + shape[:60]


def _pg_cpu_seconds(postmaster: int) -> float:
    """User + system CPU of the postmaster and its children (the backends)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pid, ppid = int(entry.name), int(fields[1])
            if pid == postmaster or ppid == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _big_jobs(n: int) -> str:
    """Half the jobs every minute, half daily (the issue's 10,000-job mix)."""
    minute = n // 2
    return jobs_toml(minute, every="1m", target="bench.common:anoop") + jobs_toml(
        n - minute, every="1d", target="bench.common:anoop", prefix="daily"
    )


@contextlib.contextmanager
def _timed_ticks() -> Iterator[list[float]]:
    """The wall time of every materializer tick while inside."""
    times: list[float] = []
    original = Materializer.tick

    async def tick(self: Materializer) -> int:
        t0 = time.perf_counter()
        try:
            return await original(self)
        finally:
            times.append(time.perf_counter() - t0)

    Materializer.tick = tick  # type: ignore[method-assign]
    try:
        yield times
    finally:
        Materializer.tick = original  # type: ignore[method-assign]


async def _scrape(store: PostgresRunStore, stop: asyncio.Event, every: float) -> None:
    """The cluster figures every ``every`` s, as a Prometheus scrape of /metrics reads them."""
    while not stop.is_set():
        await store.cluster_figures(10.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """One replica with ``args.jobs`` jobs; the statements' figures over the window."""
    configure_logging("WARNING")
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    deployment = unique_name("bench")
    jobs = (
        _big_jobs(args.jobs)
        if args.big
        else jobs_toml(args.jobs, every=args.every, target="bench.common:anoop")
    )
    horizon = parse_duration(args.horizon)
    try:
        async with bench_schema() as url:
            store = await PostgresRunStore.connect(url, min_size=1, max_size=2)
            try:
                await store.migrate()
                env = await environment(store.pool)
                loaded = make_config(
                    url,
                    deployment,
                    jobs,
                    claim_batch=500,
                    worker_concurrency=256,
                    horizon=args.horizon,
                )
                replica = Replica(Path(os.devnull), loaded)
                with _timed_ticks() as ticks:
                    task = asyncio.create_task(replica.run())
                    stop_scrape = asyncio.Event()
                    scraper = asyncio.create_task(_scrape(store, stop_scrape, args.scrape_every))
                    try:
                        result = await _measure(args, store, task, ticks, horizon)
                    finally:
                        stop_scrape.set()
                        await scraper
                        replica.stop_requested.set()
                        await asyncio.wait_for(task, 120)
            finally:
                await store.close()
    finally:
        await delete_stream(f"CLAIMD_{deployment}")
    result.update(
        environment=env,
        jobs=args.jobs,
        big=args.big,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        rss_before_mb=rss_before_kb / 1024,
    )
    return result


async def _measure(
    args: argparse.Namespace,
    store: PostgresRunStore,
    task: asyncio.Task[None],
    ticks: list[float],
    horizon: timedelta,
) -> dict[str, Any]:
    pool = store.pool
    deadline = time.monotonic() + 300
    # The horizon is materialized when every job's high-water mark is near now + horizon.
    while time.monotonic() < deadline:
        if task.done():
            task.result()
            raise RuntimeError("the replica stopped before the benchmark started")
        behind = await pool.fetchval(
            "SELECT count(*) FROM jobs WHERE enabled AND (materialized_until IS NULL"
            " OR materialized_until < now() + $1::interval - interval '5 seconds')",
            horizon,
        )
        total = await pool.fetchval("SELECT count(*) FROM jobs")
        if total >= args.jobs and behind == 0:
            break
        await asyncio.sleep(0.5)
    # Then until the first ticks' due runs are claimed: the window measures a
    # replica that keeps up, not its catch-up.
    while time.monotonic() < deadline:
        overdue = await pool.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'pending'"
            " AND due_at < now() - interval '2 seconds'"
        )
        if overdue == 0:
            break
        await asyncio.sleep(0.5)
    # Statistics as autovacuum keeps them in a replica that has run a while
    # (its first ANALYZE of a just-filled table can be a minute away): the
    # window measures the steady state, not plans made over an empty table.
    await pool.execute("ANALYZE jobs")
    await pool.execute("ANALYZE job_runs")
    await asyncio.sleep(args.warmup)
    pending = await pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'pending'")
    terminal = await pool.fetchval(
        "SELECT count(*) FROM job_runs WHERE state NOT IN ('pending', 'claimed', 'running')"
    )
    await pool.execute("SELECT public.pg_stat_statements_reset()")
    ticks.clear()
    t0, cpu0, pg0 = time.monotonic(), time.process_time(), _pg_cpu_seconds(args.postmaster)
    db0 = await pool.fetchval("SELECT now()")
    await asyncio.sleep(args.duration)
    window = time.monotonic() - t0
    cpu, pg_cpu = time.process_time() - cpu0, _pg_cpu_seconds(args.postmaster) - pg0
    db1 = await pool.fetchval("SELECT now()")
    rows = await pool.fetch(STATEMENTS)
    recorded = await pool.fetchval(
        "SELECT count(*) FROM job_run_attempts WHERE finished_at >= $1 AND finished_at < $2",
        db0,
        db1,
    )
    doubles = await pool.fetchval(
        "SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs"
        " GROUP BY 1, 2 HAVING count(*) > 1) d"
    )
    known = _known_statements()
    per: dict[str, dict[str, float]] = {}
    for r in rows:
        name = _name(r["query"], known)
        if name.startswith("?") and "pg_stat_statements" in r["query"]:
            continue
        s = per.setdefault(name, {"calls": 0, "ms": 0.0, "rows": 0, "blocks": 0, "jit_ms": 0.0})
        s["jit_ms"] += r["jit_ms"]
        s["calls"] += r["calls"]
        s["ms"] += r["total_exec_time"]
        s["rows"] += r["rows"]
        s["blocks"] += r["blocks"]
    return {
        "window_s": window,
        "pending_rows": pending,
        "terminal_rows": terminal,
        "statements": per,
        "recorded": recorded,
        "replica_cpu_s": cpu,
        "pg_cpu_s": pg_cpu,
        "double_rows": doubles,
        "materializer_ticks": list(ticks),
    }


def run_child_jobs(
    args: argparse.Namespace, url: str, postmaster: int, jobs: int, big: bool
) -> Any:
    flags = [
        "--postmaster",
        str(postmaster),
        "--jobs",
        str(jobs),
        "--every",
        args.every,
        "--horizon",
        args.horizon,
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--big",
        "1" if big else "0",
        "--scrape-every",
        str(args.scrape_every),
    ]
    return run_child(
        "bench.bench_tick_cost",
        flags,
        timeout=args.warmup + args.duration + 600,
        what=f"{jobs} jobs",
        env={**os.environ, "CLAIMD_TEST_DATABASE_URL": url},
    )


def _table(title: str, runs: list[dict[str, Any]]) -> None:
    """One line per statement, one column group per run."""
    print(title)
    names = sorted(
        {n for r in runs for n in r["statements"]},
        key=lambda n: (n not in PER_TICK, PER_TICK.index(n) if n in PER_TICK else 0, n),
    )
    head = "statement".ljust(28) + "".join(
        f"  {r['jobs']:>6} jobs: calls/s  mean ms  ms/s  blk/call  jit ms" for r in runs
    )
    print(head)
    print("-" * len(head))
    for n in names:
        if n.startswith("?") and all(
            r["statements"].get(n, {}).get("ms", 0.0) < 0.01 * r["window_s"] for r in runs
        ):
            continue  # driver chatter (BEGIN, RESET ALL, ...) under 0.01 ms/s
        cells = []
        for r in runs:
            s = r["statements"].get(n)
            if not s:
                cells.append(" " * 52)
                continue
            calls = s["calls"] / r["window_s"]
            mean = s["ms"] / s["calls"] if s["calls"] else 0.0
            cells.append(
                f"  {'':>11}{calls:8.1f} {mean:8.3f} {s['ms'] / r['window_s']:5.1f}"
                f" {s['blocks'] / max(1, s['calls']):9.0f}"
                f" {s['jit_ms'] / max(1, s['calls']):7.2f}"
            )
        print(("* " if n in PER_TICK else "  ") + n[:26].ljust(26) + "".join(cells))
    print("  * = runs on a timer whatever the work (its cost should be flat across job counts)")


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    small = [r for r in results if not r["big"]]
    if small:
        _table(
            f"\nper-statement cost, one replica, jobs every {args.every}, horizon "
            f"{args.horizon}, {args.duration:.0f} s window after the horizon is materialized",
            small,
        )
        for r in small:
            tick_ms = (
                sum(s["ms"] for n, s in r["statements"].items() if n in PER_TICK) / r["window_s"]
            )
            all_ms = sum(s["ms"] for s in r["statements"].values()) / r["window_s"]
            runs = max(1, r["recorded"])
            print(
                f"  {r['jobs']:>6} jobs: {r['pending_rows']:,} pending rows, "
                f"{r['recorded'] / r['window_s']:.0f} runs/s recorded; "
                f"per-tick statements {tick_ms:.1f} ms/s, all statements {all_ms:.1f} ms/s; "
                f"database CPU {1000 * r['pg_cpu_s'] / r['window_s']:.0f} ms/s = "
                f"{1000 * r['pg_cpu_s'] / runs:.2f} ms per run; replica CPU "
                f"{1000 * r['replica_cpu_s'] / runs:.2f} ms per run; peak RSS "
                f"{r['peak_rss_mb']:.0f} MB; duplicate rows {r['double_rows']}"
            )
        print(f"  machine: {small[0]['environment']}")
    for r in results:
        if not r["big"]:
            continue
        _table("", [r])
        ticks = [1000 * t for t in r["materializer_ticks"]]
        mat = sum(
            s["ms"]
            for n, s in r["statements"].items()
            if n in ("ACTIVE_JOBS", "DATABASE_NOW", "ADVANCE_HIGH_WATER", "INSERT_PLANNED_RUNS")
        )
        tick_ms = sum(s["ms"] for n, s in r["statements"].items() if n in PER_TICK)
        print(
            f"\n{r['jobs']:,} jobs (half every minute, half daily), horizon {args.horizon}: "
            f"{r['pending_rows']:,} pending rows; materializer tick p50 "
            f"{percentile(ticks, 50):.1f} ms, max {max(ticks, default=float('nan')):.1f} ms "
            f"over {len(ticks)} ticks (its statements {mat / r['window_s']:.1f} ms/s of "
            f"database time); per-tick statements {tick_ms / r['window_s']:.1f} ms/s; "
            f"database CPU {1000 * r['pg_cpu_s'] / r['window_s']:.0f} ms/s; "
            f"replica CPU {1000 * r['replica_cpu_s'] / r['window_s']:.0f} ms/s; "
            f"peak RSS {r['peak_rss_mb']:.0f} MB (after imports {r['rss_before_mb']:.0f} MB)"
        )


async def _create_extension(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="10,500,5000", help="comma-separated job counts")
    parser.add_argument("--every", default="10s", help="each job's interval")
    parser.add_argument("--horizon", default="2m", help="the materializer's horizon")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after materializing")
    parser.add_argument(
        "--big", type=int, default=10_000, help="jobs in the mixed run (0: leave it out)"
    )
    parser.add_argument(
        "--scrape-every", type=float, default=5.0, help="seconds between /metrics reads"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--postmaster", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        args.jobs = int(args.jobs)
        args.big = bool(args.big)
        result = asyncio.run(child(args))
        print_result(result)
        return
    bindir = postgres_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl) found")
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="claimd-bench-pg-")), bindir, PG_SETTINGS)
    pg.start()
    try:
        asyncio.run(_create_extension(pg.url))
        results = [
            run_child_jobs(args, pg.url, pg.pid, int(n), False) for n in args.jobs.split(",") if n
        ]
        if args.big:
            results.append(run_child_jobs(args, pg.url, pg.pid, args.big, True))
    finally:
        pg.stop()
    report(results, args)


if __name__ == "__main__":
    main()

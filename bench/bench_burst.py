"""The herd at :00: N jobs on one cron instant plus M spread jobs, R real replicas.

Each build (this tree, and optionally ``--against`` another source tree, the
baseline, in the same run) gets a schema and a stream of its own, one config
file with ``--herd`` jobs on ``* * * * *`` and ``--spread`` daily jobs at
seeded times in several zones (every job an async python no-op,
``bench.common:anoop``), and ``--replicas`` real ``claimd run`` processes
started at once. The bench then watches ``--minutes`` minute boundaries and
reads ``job_runs`` (both ends of a lag on the database's clock):

- first row / first start: seconds from the replicas' start to the first
  ``job_runs`` row and to the first started run;
- per minute instant of the herd: rows written, how long before the instant
  the last of them was written (``planned ahead``: every instant must be
  planned before it is due), start lag p50 / p99 / max
  (``started_at - scheduled_at``; a run not started by the end counts with the
  lag it had reached), runs not started and runs not succeeded, and the p99 of
  ``finished_at - scheduled_at``: ``started_at`` is the start statement's
  transaction time, so a larger statement shows an earlier start than its
  executions get; the recorded finish bounds when they really ran;
- per replica, scraped from its own ``/metrics`` every few seconds (the last
  scrape of each process is kept, so a restarted replica's counters add up):
  redeliveries, deliveries that changed nothing, failed publishes, and the
  largest RSS seen;
- doubled: (job, instant) with two rows, runs with two attempts.

``--kinds async,sync,shell,http``: one herd of each kind after another
(default async), and for each, what the job feels: the moment each job's own
code began (the job writes it, ``bench/burst_jobs.py``; http: a local server
notes the arrival) beside ``started_at``, executions lost and doubled, and
CPU per run from 1 s before each instant to ``--cpu-window`` s after it (claimd
own, its jobs, its PostgreSQL backends, all of PostgreSQL, nats-server); then
the floor, ``--floor-rounds`` times: the same work started at one instant by
``--replicas`` plain programs with no scheduler, ``--floor-concurrency`` (64,
claimd's ``worker_concurrency``) at a time each. With ``--against``, the other
tree needs ``bench/burst_jobs.py`` for the python kinds.

``--roll``: a rolling restart during the measured minutes, one replica at a
time (SIGTERM, wait for it to exit, start it again), 20 s after a boundary.

    python -m bench.bench_burst                                   # 10,000 at :00, 2 replicas
    python -m bench.bench_burst --herd 10000 --spread 90000       # 100,000 jobs
    python -m bench.bench_burst --roll --minutes 4
    python -m bench.bench_burst --herd 1000 --kinds shell,async,sync,http   # what the job feels
    git archive main | tar -x -C /tmp/main-tree                   # the baseline, same run:
    python -m bench.bench_burst --against /tmp/main-tree --against-label main
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg

from bench.burst_jobs import (
    BEGAN_ENV,
    KINDS,
    client_ports,
    cpu_delta,
    cpu_sample,
    instant_of,
    read_began,
    run_toml,
)
from bench.common import (
    REPO,
    Row,
    bench_schema,
    child_env,
    config_toml,
    delete_stream,
    environment,
    free_port,
    migrated_store,
    percentile,
    print_table,
    rss_mb,
    stop_processes,
)
from tests.servers import unique_name

nan = float("nan")
ANOOP = '{ python = "bench.common:anoop" }'
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney")
COUNTERS = {
    "redeliveries": "claimd_redeliveries_total",
    "changed nothing": "claimd_deliveries_skipped_total",
    "publish failed": "claimd_dispatch_publish_failed_total",
    "plans discarded": "claimd_plans_discarded_total",
}

PER_INSTANT = """
SELECT r.scheduled_at,
       count(*) AS rows,
       extract(epoch FROM r.scheduled_at - max(r.created_at))::float8 AS planned_ahead_s,
       count(*) FILTER (WHERE r.started_at IS NULL) AS not_started,
       count(*) FILTER (WHERE r.state <> 'succeeded') AS not_succeeded,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM COALESCE(r.started_at, $3) - r.scheduled_at)) AS lag,
       max(extract(epoch FROM COALESCE(r.started_at, $3) - r.scheduled_at))::float8 AS max_lag,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM COALESCE(r.finished_at, $3) - r.scheduled_at))
           AS finish_p99
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE j.name LIKE 'herd-%' AND r.scheduled_at >= $1 AND r.scheduled_at <= $2
 GROUP BY r.scheduled_at ORDER BY r.scheduled_at
"""
DOUBLED = """
SELECT (SELECT count(*) FROM (SELECT 1 FROM job_runs GROUP BY job_id, scheduled_at
                               HAVING count(*) > 1) d)
     + (SELECT count(*) FROM (SELECT 1 FROM job_run_attempts GROUP BY run_id
                               HAVING count(*) > 1) a)
"""
SPREAD_DUE = """
SELECT count(*) FILTER (WHERE r.state <> 'succeeded') AS not_succeeded, count(*) AS rows
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE j.name LIKE 'spread-%' AND r.scheduled_at <= $1
"""


def jobs_toml(herd: int, spread: int, seed: int, run: str = ANOOP) -> str:
    """``herd`` jobs every minute at :00 (each ``run``) and ``spread`` daily jobs (async
    no-ops) at seeded local times."""
    rng = random.Random(seed)
    parts = [f'[jobs.herd-{i:06d}]\ncron = "* * * * *"\nrun = {run}\n' for i in range(herd)]
    for i in range(spread):
        minute, hour, zone = rng.randrange(60), rng.randrange(24), ZONES[i % len(ZONES)]
        parts.append(
            f'[jobs.spread-{i:06d}]\ncron = "{minute} {hour} * * *"\ntimezone = "{zone}"\n'
            'run = { python = "bench.common:anoop" }\n'
        )
    return "\n".join(parts)


def _scrape(port: int) -> dict[str, float] | None:
    """The counters above, summed over their labels, from one replica's /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    out = dict.fromkeys(COUNTERS, 0.0)
    for key, name in COUNTERS.items():
        for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            out[key] += float(m.group(1))
    return out


@dataclass
class Proc:
    """One replica process: its port, log, the last counters and largest RSS it showed."""

    index: int
    port: int
    log: Path
    popen: subprocess.Popen[bytes]
    counters: dict[str, float] = field(default_factory=dict)
    rss_max: float = 0.0


@dataclass
class Build:
    """What one build did: the figures the table prints."""

    label: str
    first_row_s: float = float("nan")
    first_start_s: float = float("nan")
    instants: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    rss_max: float = 0.0
    doubled: int = 0
    spread_not_succeeded: int = 0
    spread_rows: int = 0
    notes: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    kind: str = "async"
    floors: list[dict[str, Any]] = field(default_factory=list)


def _start(
    config: Path, port: int, log: Path, tree: Path, level: str, extra: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {**child_env(), **extra}
    env["CLAIMD_HTTP"] = f"127.0.0.1:{port}"
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "run", "--config", str(config), "--log-level", level],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


async def _watch(procs: list[Proc], build: Build, stop: asyncio.Event, every: float) -> None:
    """Sample every replica's RSS each second and scrape it every ``every`` s until ``stop``.

    A scrape is not free (at 10,000 jobs /metrics is megabytes of text): it is
    made as often as Prometheus would (its default interval is 15 s or 1 min),
    and once more just before a replica is stopped, so no count is lost.
    """
    last = 0.0
    while not stop.is_set():
        for p in procs:
            build.rss_max = max(build.rss_max, rss_mb(p.popen.pid))
            p.rss_max = max(p.rss_max, rss_mb(p.popen.pid))
        if time.monotonic() - last >= every:
            last = time.monotonic()
            await _scrape_all(procs)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)


async def _scrape_all(procs: list[Proc]) -> None:
    got = await asyncio.gather(*(asyncio.to_thread(_scrape, p.port) for p in procs))
    for p, counters in zip(procs, got, strict=True):
        if counters is not None:
            p.counters = counters


def _spy(procs: list[Proc], folder: str | None) -> list[subprocess.Popen[bytes]]:
    """``py-spy record`` on each replica (raw stacks, one file each), if asked."""
    if not folder:
        return []
    Path(folder).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            ["py-spy", "record", "--pid", str(p.popen.pid), "--format", "raw", "--rate", "100",
             "--output", f"{folder}/replica-{p.index}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in procs
    ]  # fmt: skip


def _keep_logs(procs: list[Proc], label: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for p in procs:
        (folder / f"{label.replace(' ', '_')}-{p.log.name}").write_bytes(p.log.read_bytes())


def _fold(p: Proc, build: Build) -> None:
    """A process's last counters into the build's totals (before it is restarted)."""
    for key, value in p.counters.items():
        build.counters[key] += value
    p.counters = {}


async def _roll(procs: list[Proc], build: Build, args: argparse.Namespace, tree: Path) -> None:
    """SIGTERM one replica at a time and start it again, at +20 s of successive minutes."""
    for p in list(procs):
        await _sleep_until_second(20)
        await _scrape_all([p])  # its counters, just before it goes
        began = time.monotonic()
        p.popen.send_signal(signal.SIGTERM)
        await asyncio.to_thread(p.popen.wait, 120)
        _fold(p, build)
        stopped = time.monotonic() - began
        p.popen = _start(args.config_path, p.port, p.log, tree, args.log_level, args.job_env)
        build.notes.append(f"replica {p.index} restarted (its SIGTERM stop took {stopped:.1f} s)")
        await asyncio.sleep(30)


async def _sleep_until_second(second: int) -> None:
    now = time.time()
    target = (now // 60) * 60 + second
    if target <= now + 1:
        target += 60
    await asyncio.sleep(target - now)


async def measure(label: str, tree: Path, args: argparse.Namespace, kind: str) -> Build:
    """One build: start the replicas, watch the boundaries, read the figures; then the floor."""
    build = Build(label, kind=kind)
    deployment = unique_name("burst")
    server = None
    try:
        async with bench_schema("burst_") as url, migrated_store(url, max_size=2) as store:
            pool = store.pool
            with tempfile.TemporaryDirectory(prefix="claimd-burst-") as tmp:
                began_file = Path(tmp) / "began"
                server, server_url = await _server(kind, Path(tmp) / "arrived")
                if server is not None:
                    began_file = Path(tmp) / "arrived"
                job_env = {BEGAN_ENV: str(began_file), "PYTHONPATH": str(tree)}
                args.job_env = job_env
                config = Path(tmp) / "claimd.toml"
                config.write_text(
                    config_toml(
                        url,
                        deployment,
                        jobs_toml(
                            args.herd,
                            args.spread,
                            args.seed,
                            run_toml(kind, began_file, server_url),
                        ),
                        **_settings(args.set),
                    )
                )
                args.config_path = config
                began_db: datetime = await pool.fetchval("SELECT now()")
                began = time.monotonic()
                procs = [
                    Proc(i, port, log, _start(config, port, log, tree, args.log_level, job_env))
                    for i in range(args.replicas)
                    for port, log in [(free_port(), Path(tmp) / f"replica-{i}.log")]
                ]
                stop = asyncio.Event()
                watcher = asyncio.create_task(_watch(procs, build, stop, args.scrape_every))
                spies = _spy(procs, args.py_spy)
                try:
                    await _first_rows(pool, procs, build, began, args.max_start)
                    # Measure from the first whole minute after the first start.
                    waited = time.monotonic() - began  # to the first start, or the limit
                    first = (began_db + timedelta(seconds=waited)).replace(
                        second=0, microsecond=0
                    ) + timedelta(minutes=1)
                    last = first + timedelta(minutes=args.minutes - 1)
                    roll = (
                        asyncio.create_task(_roll(procs, build, args, tree)) if args.roll else None
                    )
                    cpu: dict[str, dict[str, float]] = {}
                    sampler = asyncio.create_task(
                        _cpu_at(procs, pool, first, args.minutes, args.cpu_window, cpu)
                    )
                    if args.trace:
                        build.trace = await _trace(
                            pool, first + timedelta(minutes=1), procs, args.py_spy_instant
                        )
                    await _sleep_db_until(pool, last + timedelta(seconds=args.settle))
                    if roll is not None:
                        await roll
                    await sampler
                    end: datetime = await pool.fetchval("SELECT now()")
                finally:
                    stop_processes(spies, signal.SIGINT)
                    stop.set()
                    await watcher
                    await _scrape_all(procs)
                    for p in procs:
                        _fold(p, build)
                    stop_processes([p.popen for p in procs])
                if args.keep_logs:
                    _keep_logs(procs, label, Path(args.keep_logs))
                for p in procs:
                    if p.popen.returncode not in (0, -signal.SIGTERM):
                        tail = p.log.read_text(errors="replace")[-1500:]
                        build.notes.append(f"replica {p.index} exited {p.popen.returncode}: {tail}")
                for r in await pool.fetch(PER_INSTANT, first, last, end):
                    lag = list(r["lag"] or [float("nan")] * 2)
                    build.instants.append(
                        {
                            "at": r["scheduled_at"].strftime("%H:%M"),
                            "rows": r["rows"],
                            "planned_ahead_s": r["planned_ahead_s"],
                            "not_started": r["not_started"],
                            "not_succeeded": r["not_succeeded"],
                            "p50_ms": lag[0] * 1000,
                            "p99_ms": lag[1] * 1000,
                            "max_ms": r["max_lag"] * 1000,
                            "finish_p99_ms": (r["finish_p99"] or float("nan")) * 1000,
                            **_began(
                                read_began(began_file), r["scheduled_at"].timestamp(), args.herd
                            ),
                            "cpu": cpu.get(r["scheduled_at"].strftime("%H:%M"), {}),
                        }
                    )
                build.doubled = await pool.fetchval(DOUBLED)
                s = await pool.fetchrow(SPREAD_DUE, end - timedelta(seconds=args.settle))
                build.spread_not_succeeded, build.spread_rows = s["not_succeeded"], s["rows"]
                if args.floor_rounds:
                    build.floors = await _floor(kind, args, Path(tmp), server_url)
                    if kind == "sync":  # and the floor of sync functions run in processes
                        build.floors += await _floor("sync-process", args, Path(tmp), server_url)
    finally:
        if server is not None:
            stop_processes([server])
        await delete_stream(f"CLAIMD_{deployment}")
    return build


async def _server(kind: str, file: Path) -> tuple[subprocess.Popen[bytes] | None, str]:
    """For http jobs: the local server that notes each request's arrival, and its URL."""
    if kind != "http":
        return None, ""
    port = free_port()
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before the measurement
        [sys.executable, "-m", "bench.burst_jobs", "serve", str(port), str(file)],
        cwd=REPO, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert server.stdout is not None
    await asyncio.to_thread(server.stdout.readline)  # "serving"
    return server, f"http://127.0.0.1:{port}"


def _began(lines: list[tuple[str, float]], instant: float, herd: int) -> dict[str, Any]:
    """When the herd's code began, from the lines its jobs wrote about ``instant``."""
    # A line names its instant (python, shell) or is placed by time (http, the floor).
    near = [
        (job.partition("@")[0], t - instant)
        for job, t in lines
        for tagged in [instant_of(job)]
        if (abs(tagged - instant) < 1 if tagged is not None else -5 <= t - instant < 55)
    ]
    lateness = sorted(t for _, t in near)
    jobs = {job for job, _ in near}
    return {
        "began_p50_ms": percentile(lateness, 50) * 1000,
        "began_p99_ms": percentile(lateness, 99) * 1000,
        "began_max_ms": (lateness[-1] if lateness else float("nan")) * 1000,
        "began_early": sum(1 for t in lateness if t < 0),
        "executions": len(near),
        "lost": max(0, herd - len(jobs)),
        "doubled_exec": len(near) - len(jobs),
    }


async def _cpu_at(
    procs: list[Proc],
    pool: asyncpg.Pool,
    first: datetime,
    minutes: int,
    window: float,
    out: dict[str, dict[str, float]],
) -> None:
    """CPU seconds of claimd (replicas and their children), their PostgreSQL backends (found
    by client port), all of PostgreSQL and NATS, from 1 s before each measured instant to
    ``window`` s after it."""
    for m in range(minutes):
        instant = first + timedelta(minutes=m)
        await asyncio.sleep(max(0.0, instant.timestamp() - 2 - time.time()))
        pids = [p.popen.pid for p in procs]
        ports = await asyncio.to_thread(client_ports, pids)
        backends = [
            r["pid"]
            for r in await pool.fetch(
                "SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1::int[])", ports
            )
        ]
        await asyncio.sleep(max(0.0, instant.timestamp() - 1 - time.time()))
        before = await asyncio.to_thread(cpu_sample, pids, backends)
        await asyncio.sleep(max(0.0, instant.timestamp() + window - time.time()))
        after = await asyncio.to_thread(cpu_sample, pids, backends)
        out[instant.strftime("%H:%M")] = cpu_delta(before, after)


async def _floor(kind: str, args: argparse.Namespace, tmp: Path, url: str) -> list[dict[str, Any]]:
    """The same herd started by ``--replicas`` plain programs, ``--floor-rounds`` times."""
    rounds = []
    for r in range(args.floor_rounds):
        file = tmp / f"floor-{kind}-{r}"
        at = time.time() + args.floor_lead
        counts = [args.herd // args.replicas] * args.replicas
        counts[0] += args.herd - sum(counts)
        env = {**child_env(), "PYTHONPATH": str(REPO)}
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - started before the instant they wait for
                [
                    sys.executable,
                    "-m",
                    "bench.burst_jobs",
                    "floor",
                    kind,
                    str(n),
                    repr(at),
                    str(file),
                    "--concurrency",
                    str(args.floor_concurrency),
                    "--url",
                    url,
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
            )
            for n in counts
        ]
        await asyncio.sleep(max(0.0, at - 1 - time.time()))
        before = await asyncio.to_thread(cpu_sample, [])
        await asyncio.sleep(max(0.0, at + args.cpu_window - time.time()))
        after = await asyncio.to_thread(cpu_sample, [])
        outs = [await asyncio.to_thread(p.communicate) for p in procs]
        own = [
            [float(x) for x in line.split()[1:3]]
            for out, _ in outs
            for line in (out or b"").decode().splitlines()
            if line.startswith("cpu ")
        ]
        lines = read_began(file)
        if kind == "http":  # the server notes floor requests in its own file
            lines = [x for x in read_began(tmp / "arrived") if x[0].startswith("floor-")]
            lines = [x for x in lines if -5 <= x[1] - at < 55]
        cpu = cpu_delta(before, after)
        cpu["claimd"] = sum(x[0] for x in own)  # the floor programs' own CPU
        cpu["jobs"] = sum(x[1] for x in own)  # and their children's (shell)
        label = f"{'procs' if kind == 'sync-process' else 'floor'} {r + 1}"
        rounds.append({**_began(lines, at, args.herd), "cpu": cpu, "label": label})
        await asyncio.sleep(2)
    return rounds


TRACE_STATES = """
SELECT extract(epoch FROM now() - $1::timestamptz)::float8 AS t,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'claimed') AS claimed,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
  FROM job_runs WHERE scheduled_at = $1
"""


async def _trace(
    pool: asyncpg.Pool, instant: datetime, procs: list[Proc], spy: str | None
) -> list[str]:
    """The herd's runs of one instant by state, every 250 ms from 8 s before it to 8 s after.

    ``spy``: a folder for py-spy records of each replica from 1 s before the instant, 5 s long.
    """
    await _sleep_db_until(pool, instant - timedelta(seconds=8))
    lines = []
    spied = not spy
    while True:
        if not spied and (await pool.fetchval("SELECT now()")) >= instant - timedelta(seconds=1):
            spied = True
            for p in procs:
                subprocess.Popen(  # noqa: ASYNC220 - fire and forget; it ends by itself
                    ["py-spy", "record", "--pid", str(p.popen.pid), "--format", "raw",
                     "--rate", "200", "--duration", "5", "--nonblocking",
                     "--output", f"{spy}/instant-{p.index}.txt"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
        r = await pool.fetchrow(TRACE_STATES, instant)
        lines.append(
            f"  {r['t']:+6.2f}s  pending {r['pending']:>6}  claimed {r['claimed']:>6}"
            f"  running {r['running']:>6}  succeeded {r['succeeded']:>6}"
        )
        if r["t"] > 8:
            return lines
        await asyncio.sleep(0.25)


async def _first_rows(
    pool: asyncpg.Pool, procs: list[Proc], build: Build, began: float, limit: float
) -> None:
    while time.monotonic() - began < limit:
        if any(p.popen.poll() is not None for p in procs):
            build.notes.append("a replica exited during start-up")
            return
        no_row_yet = build.first_row_s != build.first_row_s  # NaN until the first row
        if no_row_yet and await pool.fetchval("SELECT EXISTS (SELECT 1 FROM job_runs)"):
            build.first_row_s = time.monotonic() - began
        if await pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM job_runs WHERE started_at IS NOT NULL)"
        ):
            build.first_start_s = time.monotonic() - began
            return
        await asyncio.sleep(0.25)
    build.notes.append(f"no run started within {limit:.0f} s of the start")


async def _sleep_db_until(pool: asyncpg.Pool, when: datetime) -> None:
    now: datetime = await pool.fetchval("SELECT now()")
    while now < when:
        await asyncio.sleep(min(5.0, (when - now).total_seconds()))
        now = await pool.fetchval("SELECT now()")


def _settings(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        v = value.strip()
        out[key.strip()] = int(v) if v.isdigit() else (v == "true" if v in ("true", "false") else v)
    return out


def report(builds: list[Build], args: argparse.Namespace) -> None:
    base = builds[1] if len(builds) > 1 else None
    for b in builds:
        print(
            f"\n{b.label}: {args.herd:,} herd + {args.spread:,} spread jobs, "
            f"{args.replicas} replicas"
        )
        print(
            "  instant  rows    planned ahead  p50 ms   p99 ms   max ms  not started  not succeeded"
            "  finished p99 ms"
        )
        for i in b.instants:
            print(
                f"  {i['at']}   {i['rows']:>6}  {i['planned_ahead_s']:>10.1f} s"
                f"  {i['p50_ms']:>7.0f}"
                f"  {i['p99_ms']:>7.0f}  {i['max_ms']:>7.0f}  {i['not_started']:>11}"
                f"  {i['not_succeeded']:>13}  {i['finish_p99_ms']:>15.0f}"
            )
        if not b.instants:
            print("  (no herd run was written in the measured minutes)")
        missing = args.minutes * args.herd - sum(i["rows"] for i in b.instants)
        print(
            f"  rows missing from the herd's instants: {missing}; doubled: {b.doubled}; "
            f"spread rows due {b.spread_rows}, not succeeded {b.spread_not_succeeded}"
        )
        for note in b.notes:
            print(f"  note: {note}")
        if b.trace:
            print("  the second measured instant, by state (database clock, from the instant):")
            print("\n".join(b.trace))

    def worst(b: Build, key: str) -> float:
        return max((i[key] for i in b.instants), default=float("nan"))

    def least(b: Build, key: str) -> float:
        return min((i[key] for i in b.instants), default=float("nan"))

    def pick(fn: Any, b: Build | None, key: str) -> float | None:
        return None if b is None else float(fn(b, key))

    b = builds[0]
    figures: list[tuple[str, float, float | None, str, bool]] = [
        ("first row after start", b.first_row_s, base.first_row_s if base else None, "s", False),
        (
            "first start after start",
            b.first_start_s,
            base.first_start_s if base else None,
            "s",
            False,
        ),
        (
            "worst minute's p99 start lag",
            worst(b, "p99_ms"),
            pick(worst, base, "p99_ms"),
            "ms",
            False,
        ),
        (
            "worst minute's max start lag",
            worst(b, "max_ms"),
            pick(worst, base, "max_ms"),
            "ms",
            False,
        ),
        (
            "worst minute's p99 finish (recorded)",
            worst(b, "finish_p99_ms"),
            pick(worst, base, "finish_p99_ms"),
            "ms",
            False,
        ),
        (
            "least planned ahead of its instant",
            least(b, "planned_ahead_s"),
            pick(least, base, "planned_ahead_s"),
            "s",
            True,
        ),
        ("peak RSS of a replica", b.rss_max, base.rss_max if base else None, "MB", False),
    ]
    figures += [(k, b.counters[k], base.counters[k] if base else None, "", False) for k in COUNTERS]
    rows = [
        Row(name, fig, baseline, unit, higher, compared=baseline is not None)
        for name, fig, baseline, unit, higher in figures
    ]
    print_table(
        f"burst: this tree against {base.label if base else 'no baseline'} (same run)", rows
    )


def report_began(builds: list[Build], args: argparse.Namespace) -> None:
    """When the job's own code began, per instant, beside started_at and the floor."""
    cols = (
        "  instant  started p50/p99/max ms    began p50/p99/max ms    executions  lost  doubled"
        "  early  CPU ms/run: claimd, its jobs, its pg backends, all pg, nats"
    )
    for b in builds:
        print(
            f"\n{b.label}, {b.kind}: code began (the job's own clock) against started_at, "
            f"{args.herd:,} herd + {args.spread:,} other jobs, {args.replicas} replicas"
        )
        print(cols)
        rows = [(i["at"], i) for i in b.instants] + [
            (f.get("label", f"floor {n + 1}"), {**f, "p50_ms": nan, "p99_ms": nan, "max_ms": nan})
            for n, f in enumerate(b.floors)
        ]
        for at, i in rows:
            cpu = i.get("cpu", {})
            per = [
                cpu.get(k, nan) * 1000 / args.herd
                for k in ("claimd", "jobs", "backends", "postgres", "nats")
            ]
            print(
                f"  {at:<8} {i['p50_ms']:>7.0f} {i['p99_ms']:>7.0f} {i['max_ms']:>7.0f}"
                f"    {i['began_p50_ms']:>7.0f} {i['began_p99_ms']:>7.0f} {i['began_max_ms']:>7.0f}"
                f"   {i['executions']:>10}  {i['lost']:>4}  {i['doubled_exec']:>7}"
                f"  {i['began_early']:>5}  " + ", ".join(f"{x:.3f}" for x in per)
            )
        worst = max((i["began_p99_ms"] for i in b.instants), default=nan)
        threads = [f for f in b.floors if not str(f.get("label", "")).startswith("procs")]
        floor = max((f["began_p99_ms"] for f in threads), default=nan)
        print(
            f"  worst minute's code-began p99 {worst:.0f} ms; the floor's worst p99 {floor:.0f} ms"
            f" ({worst / floor:.2f}x); floor: {args.replicas} plain programs,"
            f" {args.floor_concurrency} at a time each (its own CPU in the claimd column)"
        )
        procs = [f for f in b.floors if str(f.get("label", "")).startswith("procs")]
        if procs:
            in_procs = max(f["began_p99_ms"] for f in procs)
            print(
                f"  in processes (procs: a plain process pool of {args.floor_concurrency} warm"
                f" processes per program): worst p99 {in_procs:.0f} ms ({worst / in_procs:.2f}x)"
            )


async def main(args: argparse.Namespace) -> None:
    print(await environment(), f"load {os.getloadavg()[0]:.1f}")
    for kind in args.kinds.split(","):
        builds = [await measure("this tree", REPO, args, kind)]
        if args.against:
            builds.append(await measure(args.against_label, Path(args.against), args, kind))
        print(f"load after {kind} {os.getloadavg()[0]:.1f}")
        report(builds, args)
        report_began(builds, args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--herd", type=int, default=10_000, help="jobs on * * * * * (default 10,000)")
    p.add_argument("--spread", type=int, default=0, help="daily jobs at seeded times and zones")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--minutes", type=int, default=3, help="minute boundaries measured")
    p.add_argument("--settle", type=float, default=20.0, help="seconds after the last boundary")
    p.add_argument("--max-start", type=float, default=180.0, help="seconds to wait for a start")
    p.add_argument("--roll", action="store_true", help="rolling restart during the minutes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", action="append", default=[], help="claimd setting key=value")
    p.add_argument(
        "--log-level",
        default="info",
        help="the replicas' log level (default info, claimd's own: a line per start and finish)",
    )
    p.add_argument("--trace", action="store_true", help="the second instant's runs by state")
    p.add_argument("--py-spy-instant", help="with --trace: py-spy the replicas around it")
    p.add_argument("--scrape-every", type=float, default=15.0, help="seconds between scrapes")
    p.add_argument("--keep-logs", help="copy each replica's log into this folder")
    p.add_argument("--py-spy", help="py-spy record each replica into this folder")
    p.add_argument("--against", help="another source tree, measured after this one")
    p.add_argument("--against-label", default="baseline")
    p.add_argument(
        "--kinds",
        default="async",
        help=f"herd kinds, one after another, comma-separated, of {','.join(KINDS)}",
    )
    p.add_argument("--floor-rounds", type=int, default=3, help="floor instants per kind (0: none)")
    p.add_argument(
        "--floor-concurrency", type=int, default=64, help="the floor's limit (claimd's default)"
    )
    p.add_argument("--floor-lead", type=float, default=6.0, help="s from spawn to the instant")
    p.add_argument("--cpu-window", type=float, default=10.0, help="CPU read from -1 s to this")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

"""Python jobs at one instant: when each job's own code began, sync (warm child processes)
beside async (in the replica, on its job loop).

Real `claimd run` replicas (``--replicas``, every role, defaults unless told).
``N`` runs of each variant's job are inserted with one due instant ``T`` (a
few seconds ahead, so they are claimed ahead and held; each run's
``scheduled_at`` is ``T`` plus i microseconds, the unique key): each run's
function notes when its code began. Reported per variant: code-began lateness
(began - T) and ``started_at`` lateness (the start statement's time - T),
p50 / p99 / max, how long until the last run was recorded, runs not
succeeded (lost), executions beyond one per run (doubled), runs claimed again
or retried, and the replicas' peak RSS (sampled; fork servers and children
not included). ``--beside`` puts that many daily jobs in the config.

    python -m bench.bench_python_herd [--runs 1000,10000] [--variants sync,async]
        [--replicas 2] [--beside 90000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory, mkdtemp

from actors.domain import RunContext
from bench.common import (
    bench_schema,
    child_env,
    config_toml,
    migrated_store,
    percentile,
    rss_mb,
    stop_processes,
)
from tests.servers import unique_name

BEGAN_ENV = "PYHERD_BEGAN"
AHEAD_S = 8.0  # T is this far after the insert: the runs are claimed ahead of it


def _note_began(ctx: RunContext, variant: str) -> None:
    line = f"{variant} {ctx.scheduled_at.timestamp():.6f} {time.time():.6f}\n".encode()
    fd = os.open(os.environ[BEGAN_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def began(ctx: RunContext) -> None:
    """A sync no-op that notes when its code began (in a warm child process)."""
    _note_began(ctx, "sync")


async def abegan(ctx: RunContext) -> None:
    """The async no-op that notes when its code began (in the replica)."""
    _note_began(ctx, "async")


def _beside(n: int) -> str:
    """``n`` daily jobs beside the herd's (never due during the bench)."""
    return "".join(
        f'\n[jobs.daily-{i:05d}]\ncron = "{i % 60} {3 + i % 4} * * *"\n'
        'run = { python = "bench.common:noop" }\n'
        for i in range(n)
    )


def _profiled(replica: int) -> list[str]:
    """``PYHERD_PROFILE=DIR``: each replica runs under cProfile, its stats in DIR."""
    folder = os.environ.get("PYHERD_PROFILE")
    return ["-m", "cProfile", "-o", f"{folder}/replica{replica}.prof"] if folder else []


def _stats(values: list[float]) -> str:
    if not values:
        return "p50 -  p99 -  max -"
    return (
        f"p50 {percentile(values, 50):.3f}  p99 {percentile(values, 99):.3f}  max {max(values):.3f}"
    )


async def measure(
    n: int, variants: list[str], replicas: int, beside: int, **settings: object
) -> str:
    """``n`` runs of each variant's job, all due at one instant, through ``replicas`` replicas."""
    targets = {"sync": "began", "async": "abegan"}
    jobs = "".join(
        f'\n[jobs.herd-{v}]\ncron = "0 0 1 1 *"\ntimeout = "10m"\n'
        f'run = {{ python = "bench.bench_python_herd:{targets[v]}" }}\n'
        for v in variants
    )
    async with bench_schema() as schema_url, migrated_store(schema_url) as store:
        # PYHERD_KEEP=1: the folder (config, replica logs, the began file) is kept.
        kept = os.environ.get("PYHERD_KEEP")
        with contextlib.nullcontext(mkdtemp()) if kept else TemporaryDirectory() as folder:
            if kept:
                print("kept:", folder)
            deployment = unique_name("pyherd")
            config = Path(folder) / "claimd.toml"
            config.write_text(
                config_toml(schema_url, deployment, jobs + _beside(beside), **settings)
            )
            began_file = Path(folder) / "began"
            env = {**child_env(), BEGAN_ENV: str(began_file)}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
            env.pop("CLAIMD_TEST_DATABASE_URL", None)
            procs = []
            for r in range(replicas):
                with (Path(folder) / f"replica{r}.log").open("wb") as log:
                    procs.append(
                        subprocess.Popen(  # noqa: ASYNC220 - the bench drives its replicas
                            [
                                sys.executable,
                                *_profiled(r),
                                "-m",
                                "actors.cli",
                                "--log-level",
                                "WARNING",
                                "run",
                                "--config",
                                str(config),
                            ],
                            env=env,
                            stdout=log,
                            stderr=log,
                        )
                    )
            try:
                total = len(variants) + beside
                while await store.pool.fetchval("SELECT count(*) FROM jobs") < total:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(3.0)  # the workers are subscribed
                at = await store.pool.fetchval(
                    "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) "
                    "SELECT j.id, t.at + make_interval(secs => i / 1e6), t.at, 'manual' "
                    "FROM jobs j, (SELECT now() + make_interval(secs => $2) AS at) t, "
                    "generate_series(0, $1 - 1) i WHERE j.name LIKE 'herd-%' RETURNING due_at",
                    n,
                    AHEAD_S,
                )
                t0 = at.timestamp()
                peak = 0.0
                expected = n * len(variants)
                deadline = time.time() + AHEAD_S + 60 + n * 0.05
                while time.time() < deadline:
                    peak = max(peak, *(rss_mb(p.pid) for p in procs))
                    done = await store.pool.fetchval(
                        "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
                        "WHERE j.name LIKE 'herd-%' AND r.state IN ('succeeded', 'failed')"
                    )
                    if done >= expected:
                        break
                    await asyncio.sleep(0.25)
                rows = await store.pool.fetch(
                    "SELECT j.name, r.state, r.claimed_at, r.started_at, r.finished_at, r.attempt, "
                    "r.claim_epoch "
                    "FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE j.name LIKE 'herd-%'"
                )
            finally:
                stop_processes(procs)
            notes = [line.split() for line in began_file.read_text().splitlines()]
    lines = []
    for v in variants:
        mine = [r for r in rows if r["name"] == f"herd-{v}"]
        started = [r["started_at"].timestamp() - t0 for r in mine if r["started_at"]]
        claimed = [r["claimed_at"].timestamp() - t0 for r in mine if r["claimed_at"]]
        finished = [r["finished_at"].timestamp() for r in mine if r["finished_at"]]
        code = [float(b) - t0 for who, _, b in notes if who == v]
        runs_noted = {s for who, s, _ in notes if who == v}
        lost = sum(1 for r in mine if r["state"] != "succeeded")
        doubled = len(code) - len(runs_noted)
        again = sum(1 for r in mine if r["attempt"] > 1 or r["claim_epoch"] > 1)
        last = f"{max(finished) - t0:.2f}" if finished else "-"
        if os.environ.get("PYHERD_HIST"):  # runs started and begun per second after T
            for name, values in (("started", started), ("began", code)):
                counts: dict[int, int] = {}
                for value in values:
                    counts[int(value // 1)] = counts.get(int(value // 1), 0) + 1
                lines.append(f"{v} {name} per second: {dict(sorted(counts.items()))}")
        lines.append(
            f"{v:<5} {n:>6,} runs  code began {_stats(code)} s  |  started_at {_stats(started)} s"
            f"  |  claimed_at {_stats(claimed)} s"
            f"  |  last recorded {last} s  not succeeded {lost}  doubled {doubled}"
            f"  re-claimed or retried {again}"
        )
    lines.append(
        f"      {replicas} replica(s), {beside:,} jobs beside, peak replica RSS {peak:.0f} MB"
    )
    return "\n".join(lines)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1000,10000", help="runs of each variant's job")
    parser.add_argument(
        "--variants",
        default="sync,async",
        help="sync,async: both herds at the same instant; sync or async: one herd",
    )
    parser.add_argument("--replicas", type=int, default=2, help="claimd run replicas")
    parser.add_argument("--beside", type=int, default=0, help="daily jobs in the config beside")
    parser.add_argument(
        "--concurrency", type=int, default=0, help="worker_concurrency (0: default)"
    )
    parser.add_argument("--python-processes", type=int, default=0, help="(0: the default)")
    parser.add_argument(
        "--async-concurrency", type=int, default=0, help="worker_async_concurrency (0: default)"
    )
    args = parser.parse_args(argv)
    settings: dict[str, object] = {}
    if args.concurrency:
        settings["worker_concurrency"] = args.concurrency
    if args.async_concurrency:
        settings["worker_async_concurrency"] = args.async_concurrency
    if args.python_processes:
        settings["python_processes"] = args.python_processes
    print(
        "python jobs at one instant; code began: when each job's function began, after the "
        "instant (seconds); started_at: the start statement's time"
    )
    for n in (int(x) for x in args.runs.split(",")):
        variants = args.variants.split(",")
        print(await measure(n, variants, args.replicas, args.beside, **settings), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

"""Python jobs at one instant: when each job's own code began, sync (a child process each)
against async (in the replica, on its job loops).

One real `claimd run` replica per variant (every role). ``N`` runs of one job
are inserted with one due instant ``T`` (a few seconds ahead; each run's
``scheduled_at`` is ``T`` plus i microseconds, the unique key): each run's
function notes when its code began. Reported: code-began lateness
(began - T) p50 / p99 / max, how long until the last run was recorded, and
the replica's peak RSS (sampled; the fork server and its children not
included).

    python -m bench.bench_python_herd [--runs 1000,10000] [--variants sync,async]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

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


def _note_began(ctx: RunContext) -> None:
    line = f"{ctx.scheduled_at.timestamp():.6f} {time.time():.6f}\n".encode()
    fd = os.open(os.environ[BEGAN_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def began(ctx: RunContext) -> None:
    """A sync no-op that notes when its code began (in its child process)."""
    _note_began(ctx)


async def abegan(ctx: RunContext) -> None:
    """The async no-op that notes when its code began (in the replica)."""
    _note_began(ctx)


async def measure(n: int, variant: str, concurrency: int) -> str:
    target = "bench.bench_python_herd:" + ("began" if variant == "sync" else "abegan")
    async with bench_schema() as schema_url, migrated_store(schema_url) as store:
        with TemporaryDirectory() as folder:
            deployment = unique_name("pyherd")
            config = Path(folder) / "claimd.toml"
            config.write_text(
                config_toml(
                    schema_url,
                    deployment,
                    f'\n[jobs.herd]\ncron = "0 0 1 1 *"\ntimeout = "10m"\n'
                    f'run = {{ python = "{target}" }}\n',
                    worker_concurrency=concurrency,
                )
            )
            began_file = Path(folder) / "began"
            env = {**child_env(), BEGAN_ENV: str(began_file)}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
            env.pop("CLAIMD_TEST_DATABASE_URL", None)
            with (Path(folder) / "replica.log").open("wb") as log:
                proc = subprocess.Popen(  # noqa: ASYNC220 - the bench drives one child
                    [sys.executable, "-m", "actors.cli", "--log-level", "WARNING", "run",
                     "--config", str(config)],
                    env=env, stdout=log, stderr=log,
                )  # fmt: skip
            try:
                while not await store.pool.fetchval("SELECT count(*) FROM jobs"):
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2.0)  # the worker is subscribed
                at = await store.pool.fetchval(
                    "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) "
                    "SELECT j.id, t.at + make_interval(secs => i / 1e6), t.at, 'manual' "
                    "FROM jobs j, (SELECT now() + make_interval(secs => $2) AS at) t, "
                    "generate_series(0, $1 - 1) i RETURNING due_at",
                    n,
                    AHEAD_S,
                )
                t0 = at.timestamp()
                peak = 0.0
                deadline = time.time() + AHEAD_S + 60 + n * 0.05
                while time.time() < deadline:
                    peak = max(peak, rss_mb(proc.pid))
                    done = await store.pool.fetchval(
                        "SELECT count(*) FROM job_runs WHERE state IN ('succeeded', 'failed')"
                    )
                    if done >= n:
                        break
                    await asyncio.sleep(0.25)
                last = await store.pool.fetchval("SELECT max(finished_at) FROM job_runs")
                failed = await store.pool.fetchval(
                    "SELECT count(*) FROM job_runs WHERE state <> 'succeeded'"
                )
            finally:
                stop_processes([proc])
            lateness = [
                float(b) - t0
                for s, b in (line.split() for line in began_file.read_text().splitlines())
            ]
    last_s = f"{last.timestamp() - t0:.2f}" if last else "-"
    return (
        f"{variant:<5} {n:>6,} runs  concurrency {concurrency:>4}  "
        f"began p50 {percentile(lateness, 50):.3f} s  p99 {percentile(lateness, 99):.3f} s  "
        f"max {max(lateness, default=float('nan')):.3f} s  last recorded {last_s} s  "
        f"executions {len(lateness):,}  not succeeded {failed}  peak RSS {peak:.0f} MB"
    )


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1000,10000")
    parser.add_argument("--variants", default="sync,async")
    parser.add_argument("--concurrency", type=int, default=64, help="worker_concurrency")
    args = parser.parse_args(argv)
    print("python jobs at one instant; began: when each job's code began, after the instant")
    for n in (int(x) for x in args.runs.split(",")):
        for variant in args.variants.split(","):
            print(await measure(n, variant, args.concurrency), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

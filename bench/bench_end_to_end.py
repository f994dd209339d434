"""End to end: one ``actors.replica.Replica`` in one process, every actor, real servers.

Runs ``--jobs`` python jobs (a no-op, ``bench.common:noop``; ``--job async`` for
the async one) every ``--every`` for ``--warmup`` + ``--duration`` seconds,
then stops the replica the way SIGTERM does and reads ``job_runs``:

- runs/s recorded: attempts finished inside the measured window, per second
  (the schedule asks for jobs / every);
- start lag p50/p95/p99: ``started_at - scheduled_at`` of the runs scheduled in
  the window. A run not started by the time the replica stopped counts with
  the lag it had reached then (a lower bound), so a replica that falls behind
  cannot look good by leaving its late runs out;
- peak RSS (``resource.getrusage``) and CPU seconds of the process;
- duplicates: rows per (job, scheduled_at) > 1, attempts per run > 1, plus the
  worker's redelivery and fenced-completion counters.

Each configuration runs in a subprocess of its own, so its peak RSS is its own:
the shipped batching (``claim_batch`` 500, ``worker_concurrency`` 256) against
the naive baseline (``claim_batch`` 1, ``worker_concurrency`` 1).

    python -m bench.bench_end_to_end [--jobs 200 --duration 18]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import REGISTRY

from actors.domain import parse_duration
from actors.observability import configure_logging
from actors.replica import Replica
from bench.common import (
    Row,
    bench_schema,
    delete_stream,
    environment,
    jobs_toml,
    make_config,
    migrated_store,
    print_result,
    print_table,
    run_child,
)
from tests.servers import unique_name

VARIANTS: dict[str, dict[str, int]] = {
    "batched": {"claim_batch": 500, "worker_concurrency": 256},
    "baseline": {"claim_batch": 1, "worker_concurrency": 1},
    # Half-naive configurations, to tell which half limits the baseline.
    "claim-1": {"claim_batch": 1, "worker_concurrency": 256},
    "worker-1": {"claim_batch": 500, "worker_concurrency": 1},
}

WINDOW_STATS = """
WITH w AS (
    SELECT r.*, extract(epoch FROM COALESCE(r.started_at, $3) - r.scheduled_at)::float8 AS lag
      FROM job_runs r
     WHERE r.scheduled_at >= $1 AND r.scheduled_at < $2
)
SELECT count(*) AS scheduled,
       count(*) FILTER (WHERE started_at IS NOT NULL) AS started,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state NOT IN ('succeeded', 'pending', 'claimed', 'running'))
           AS other_terminal,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY lag) AS lag,
       max(lag) AS max_lag
  FROM w
"""
RECORDED_IN_WINDOW = """
SELECT count(*) FROM job_run_attempts WHERE finished_at >= $1 AND finished_at < $2
"""
DOUBLE_ROWS = """
SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs
                       GROUP BY 1, 2 HAVING count(*) > 1) d
"""
DOUBLE_ATTEMPTS = """
SELECT count(*) FROM (SELECT run_id FROM job_run_attempts
                       GROUP BY 1 HAVING count(*) > 1) d
"""


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _metric_sum(name: str) -> float:
    total = 0.0
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration; returns its figures."""
    configure_logging(args.log_level.upper())
    settings = VARIANTS[args.child]
    target = "bench.common:anoop" if args.job == "async" else "bench.common:noop"
    deployment = unique_name("bench")
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        async with bench_schema() as url, migrated_store(url, max_size=2) as store:
            env = await environment(store.pool)
            loaded = make_config(
                url, deployment, jobs_toml(args.jobs, every=args.every, target=target), **settings
            )
            replica = Replica(Path(os.devnull), loaded)
            cpu0 = time.process_time()
            started = await store.pool.fetchval("SELECT now()")
            task = asyncio.create_task(replica.run())
            try:
                done, _ = await asyncio.wait({task}, timeout=args.warmup + args.duration)
                if task in done:
                    task.result()  # the replica stopped on its own: show why
                    raise RuntimeError("the replica stopped before the benchmark ended")
            finally:
                stopped = await store.pool.fetchval("SELECT now()")
                replica.stop_requested.set()
                await asyncio.wait_for(task, 120)
            cpu = time.process_time() - cpu0
            window_start = started + timedelta(seconds=args.warmup)
            w = await store.pool.fetchrow(WINDOW_STATS, window_start, stopped, stopped)
            recorded = await store.pool.fetchval(RECORDED_IN_WINDOW, window_start, stopped)
            doubles = await store.pool.fetchval(DOUBLE_ROWS)
            double_attempts = await store.pool.fetchval(DOUBLE_ATTEMPTS)
            total_attempts = await store.pool.fetchval("SELECT count(*) FROM job_run_attempts")
    finally:
        nats_version = await delete_stream(f"CLAIMD_{deployment}")
    env += f", NATS {nats_version}"
    window = (stopped - window_start).total_seconds()
    lag = list(w["lag"] or [float("nan")] * 3)
    return {
        "variant": args.child,
        "settings": settings,
        "environment": env,
        "window_s": window,
        "scheduled": w["scheduled"],
        "started": w["started"],
        "succeeded": w["succeeded"],
        "other_terminal": w["other_terminal"],
        "recorded_per_s": recorded / window if window > 0 else 0.0,
        "expected_per_s": args.jobs / parse_duration(args.every).total_seconds(),
        "lag_p50": lag[0],
        "lag_p95": lag[1],
        "lag_p99": lag[2],
        "lag_max": w["max_lag"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before_kb / 1024,
        "cpu_s": cpu,
        "attempts_total": total_attempts,
        "double_rows": doubles,
        "runs_with_several_attempts": double_attempts,
        "redeliveries": _metric("claimd_redeliveries_total"),
        "fenced_completions": _metric("claimd_fenced_completions_total"),
        "deliveries_skipped": _metric_sum("claimd_deliveries_skipped_total"),
    }


def run_child_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    flags = [
        variant,
        "--jobs",
        str(args.jobs),
        "--every",
        args.every,
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--job",
        args.job,
        "--log-level",
        args.log_level,
    ]
    return run_child(
        "bench.bench_end_to_end",
        flags,
        timeout=args.warmup + args.duration + 180,
        what=f"variant {variant}",
    )


def _per_1000(r: dict[str, Any]) -> float:
    return 1000 * float(r["cpu_s"]) / max(1, int(r["attempts_total"]))


def describe(r: dict[str, Any]) -> None:
    print(
        f"  {r['variant']} {r['settings']}: window {r['window_s']:.1f}s, "
        f"{r['scheduled']} scheduled, {r['started']} started, {r['succeeded']} "
        f"succeeded, {r['other_terminal']} other terminal; max lag "
        f"{r['lag_max']:.2f}s; RSS after imports {r['rss_before_mb']:.0f} MB; "
        f"CPU {r['cpu_s']:.1f}s"
    )
    print(
        f"    duplicates: {r['double_rows']} (job, instant) with >1 row, "
        f"{r['runs_with_several_attempts']} runs with >1 attempt, "
        f"{r['redeliveries']:.0f} redeliveries, {r['fenced_completions']:.0f} fenced "
        f"completions, {r['deliveries_skipped']:.0f} deliveries that changed nothing"
    )


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """One table per baseline: the batched configuration against it."""
    b = results["batched"]
    for r in results.values():
        describe(r)
    baselines: list[dict[str, Any] | None] = [
        r for name, r in results.items() if name != "batched"
    ] or [None]
    for n in baselines:

        def base(key: str, n: dict[str, Any] | None = n) -> float | None:
            return None if n is None else float(n[key])

        rows = [
            Row("runs/s recorded", b["recorded_per_s"], base("recorded_per_s"), "runs/s"),
            Row("start lag p50", b["lag_p50"], base("lag_p50"), "s", higher_is_better=False),
            Row("start lag p95", b["lag_p95"], base("lag_p95"), "s", higher_is_better=False),
            Row("start lag p99", b["lag_p99"], base("lag_p99"), "s", higher_is_better=False),
            Row("peak RSS", b["peak_rss_mb"], base("peak_rss_mb"), "MB", higher_is_better=False),
            Row(
                "CPU per 1000 recorded runs",
                _per_1000(b),
                None if n is None else _per_1000(n),
                "s",
                higher_is_better=False,
            ),
        ]
        against = "" if n is None else f" vs {n['variant']} {n['settings']}"
        print_table(
            f"end to end: {args.jobs} jobs every {args.every}, expected "
            f"{b['expected_per_s']:.0f} runs/s; batched {b['settings']}{against}",
            rows,
            [
                f"machine: {b['environment']}",
                "lag of a run not started when the replica stopped = its lag at that moment "
                "(lower bound)",
            ],
        )


async def _child_main(args: argparse.Namespace) -> None:
    result = await child(args)
    print_result(result)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--every", default="1s", help="each job's interval")
    parser.add_argument(
        "--duration", type=float, default=18.0, help="measured seconds per configuration"
    )
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="seconds before the measured window starts"
    )
    parser.add_argument(
        "--job",
        choices=("sync", "async"),
        default="sync",
        help="no-op python job: sync (runs in a thread) or async",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        help="the replica's log level (info logs two lines per run)",
    )
    parser.add_argument(
        "--baselines",
        default="baseline",
        help="comma-separated configurations to compare against: "
        f"{', '.join(v for v in VARIANTS if v != 'batched')}; "
        "empty for none",
    )
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        asyncio.run(_child_main(args))
        return
    names = [n for n in args.baselines.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS or n == "batched"]
    if unknown:
        raise SystemExit(f"unknown baseline(s): {', '.join(unknown)}")
    results = {"batched": run_child_variant("batched", args)}
    for name in names:
        results[name] = run_child_variant(name, args)
    report(results, args)


if __name__ == "__main__":
    main()

"""Start lag: one replica, N jobs every second, the previous configuration against the new.

Each configuration runs one ``actors.replica.Replica`` (every actor, real servers)
in a subprocess of its own, with ``--jobs`` async no-op python jobs
(``bench.common:anoop``) every ``--every`` (interval schedules are anchored at
the epoch, so all the jobs share each instant: N runs per instant), for
``--warmup`` + ``--duration`` seconds, then stops it the way SIGTERM does and
reads ``job_runs``:

- start lag p50 / p99 / max: ``started_at - scheduled_at`` (both on the
  database's clock) of the runs scheduled in the measured window; a run not
  started when the replica stopped counts with the lag it had reached then;
- missed: runs of the window not started by the stop, runs recorded skipped or
  otherwise not succeeded, instants the materializer dropped, and rows missing
  from jobs x instants;
- duplicates: (job, instant) with more than one row, runs with more than one
  attempt, fenced completions;
- early starts: runs started before their instant (must be 0).

Configurations (``--variants``):

- ``previous``: ``claim_ahead = "0s"``, ``claim_wake = false``: polling every
  ``claim_interval`` only, as before claim-ahead existed (the baseline);
- ``new``: the shipped defaults (``claim_ahead`` 5s, ``claim_wake`` on);
- ``ahead-500ms``: the defaults with ``claim_ahead = "500ms"``.

    python -m bench.bench_lag [--jobs 100,500 --duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import REGISTRY

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

VARIANTS: dict[str, dict[str, object]] = {
    "previous": {"claim_ahead": "0s", "claim_wake": False},
    "new": {},
    # Half the default: on a loaded 2-core machine, claim + publish + fetch of 500
    # runs sometimes takes longer than that (claimd_run_arrival_ahead_seconds).
    "ahead-500ms": {"claim_ahead": "500ms"},
}

WINDOW_STATS = """
WITH w AS (
    SELECT r.*, extract(epoch FROM COALESCE(r.started_at, $3) - r.scheduled_at)::float8 AS lag
      FROM job_runs r
     WHERE r.scheduled_at >= $1 AND r.scheduled_at < $2
)
SELECT count(*) AS scheduled,
       count(DISTINCT scheduled_at) AS instants,
       count(*) FILTER (WHERE started_at IS NOT NULL) AS started,
       count(*) FILTER (WHERE started_at < scheduled_at) AS early,
       count(*) FILTER (WHERE state NOT IN ('succeeded', 'pending', 'claimed', 'running'))
           AS other_terminal,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY lag) AS lag,
       max(lag) AS max_lag
  FROM w
"""
# The instants with the worst lag: whether a tail is one late instant or spread.
WORST_INSTANTS = """
SELECT extract(epoch FROM scheduled_at - $1)::float8 AS at_s, count(*) AS runs,
       extract(epoch FROM min(COALESCE(started_at, $3) - scheduled_at))::float8 * 1000 AS min_ms,
       extract(epoch FROM max(COALESCE(started_at, $3) - scheduled_at))::float8 * 1000 AS max_ms
  FROM job_runs
 WHERE scheduled_at >= $1 AND scheduled_at < $2
 GROUP BY scheduled_at
 ORDER BY max_ms DESC
 LIMIT 3
"""
DOUBLE_ROWS = """
SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs
                       GROUP BY 1, 2 HAVING count(*) > 1) d
"""
DOUBLE_ATTEMPTS = """
SELECT count(*) FROM (SELECT run_id FROM job_run_attempts
                       GROUP BY 1 HAVING count(*) > 1) d
"""


def _metric_sum(name: str) -> float:
    return sum(s.value for family in REGISTRY.collect() for s in family.samples if s.name == name)


def _settings(args: argparse.Namespace, variant: str) -> dict[str, object]:
    settings = dict(VARIANTS[variant])
    if args.concurrency:
        settings["worker_concurrency"] = args.concurrency
    return settings


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration at one job count; returns its figures."""
    configure_logging(args.log_level.upper())
    settings = _settings(args, args.child)
    deployment = unique_name("benchlag")
    load_before = os.getloadavg()
    try:
        async with bench_schema("benchlag_") as url, migrated_store(url, max_size=2) as store:
            env = await environment(store.pool)
            jobs = jobs_toml(args.jobs, every=args.every, target="bench.common:anoop")
            loaded = make_config(url, deployment, jobs, **settings)
            replica = Replica(Path(os.devnull), loaded)
            cpu0 = time.process_time()
            started = await store.pool.fetchval("SELECT now()")
            task = asyncio.create_task(replica.run())
            try:
                done, _ = await asyncio.wait({task}, timeout=args.warmup + args.duration)
                if task in done:
                    task.result()
                    raise RuntimeError("the replica stopped before the benchmark ended")
            finally:
                stopped = await store.pool.fetchval("SELECT now()")
                replica.stop_requested.set()
                await asyncio.wait_for(task, 120)
            cpu = time.process_time() - cpu0
            window_start = started + timedelta(seconds=args.warmup)
            w = await store.pool.fetchrow(WINDOW_STATS, window_start, stopped, stopped)
            worst = await store.pool.fetch(WORST_INSTANTS, window_start, stopped, stopped)
            doubles = await store.pool.fetchval(DOUBLE_ROWS)
            double_attempts = await store.pool.fetchval(DOUBLE_ATTEMPTS)
    finally:
        await delete_stream(f"CLAIMD_{deployment}")
    lag = list(w["lag"] or [float("nan")] * 2)
    scheduled = int(w["scheduled"])
    return {
        "variant": args.child,
        "jobs": args.jobs,
        "settings": settings,
        "effective_claim_ahead_ms": loaded.settings.effective_claim_ahead.total_seconds() * 1000,
        "environment": env,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "window_s": (stopped - window_start).total_seconds(),
        "scheduled": scheduled,
        "instants": int(w["instants"]),
        "missing_rows": int(w["instants"]) * args.jobs - scheduled,
        "not_started": scheduled - int(w["started"]),
        "other_terminal": int(w["other_terminal"]),
        "materializer_missed": _metric_sum("claimd_runs_missed_total"),
        "early": int(w["early"]),
        "lag_p50_ms": lag[0] * 1000,
        "lag_p99_ms": lag[1] * 1000,
        "lag_max_ms": float(w["max_lag"] or float("nan")) * 1000,
        "worst_instants": [
            f"+{r['at_s']:.0f}s: {r['runs']} runs, {r['min_ms']:.0f}-{r['max_ms']:.0f}ms"
            for r in worst
        ],
        "double_rows": doubles,
        "runs_with_several_attempts": double_attempts,
        "fenced_completions": _metric_sum("claimd_fenced_completions_total"),
        "redeliveries": _metric_sum("claimd_redeliveries_total"),
        # Runs that reached the worker already due (the 0 bucket), of those with a due_at.
        "arrived_due": REGISTRY.get_sample_value(
            "claimd_run_arrival_ahead_seconds_bucket", {"le": "0.0"}
        )
        or 0.0,
        "arrivals": _metric_sum("claimd_run_arrival_ahead_seconds_count"),
        "cpu_s": cpu,
    }


def run_child_variant(variant: str, jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    flags = [
        variant,
        "--jobs",
        str(jobs),
        "--every",
        args.every,
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--concurrency",
        str(args.concurrency or 0),
        "--log-level",
        args.log_level,
    ]
    return run_child(
        "bench.bench_lag",
        flags,
        timeout=args.warmup + args.duration + 180,
        what=f"variant {variant}",
    )


def _missed(r: dict[str, Any]) -> int:
    return int(
        r["not_started"]
        + r["other_terminal"]
        + r["materializer_missed"]
        + max(0, r["missing_rows"])
    )


def _duplicates(r: dict[str, Any]) -> int:
    return int(r["double_rows"] + r["runs_with_several_attempts"] + r["fenced_completions"])


def report(new: dict[str, Any], base: dict[str, Any] | None, args: argparse.Namespace) -> None:
    for r in (new, base):
        if r is None:
            continue
        print(
            f"  {r['variant']} {r['settings']} (claim_ahead {r['effective_claim_ahead_ms']:.0f}ms):"
            f" window {r['window_s']:.1f}s, {r['scheduled']} runs in {r['instants']} instants, "
            f"not started {r['not_started']}, other terminal {r['other_terminal']}, "
            f"materializer missed {r['materializer_missed']:.0f}, missing rows "
            f"{r['missing_rows']}, started early {r['early']}, redeliveries "
            f"{r['redeliveries']:.0f}, arrived due already {r['arrived_due']:.0f} of "
            f"{r['arrivals']:.0f}, CPU {r['cpu_s']:.1f}s, load "
            f"{r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}"
        )
        print(f"    worst instants: {'; '.join(r['worst_instants'])}")

    def b(key: str) -> float | None:
        return None if base is None else float(base[key])

    rows = [
        Row("start lag p50", new["lag_p50_ms"], b("lag_p50_ms"), "ms", higher_is_better=False),
        Row("start lag p99", new["lag_p99_ms"], b("lag_p99_ms"), "ms", higher_is_better=False),
        Row("start lag max", new["lag_max_ms"], b("lag_max_ms"), "ms", higher_is_better=False),
        Row(
            "missed, or not started by the stop",
            _missed(new),
            None if base is None else _missed(base),
            "runs",
            compared=False,
        ),
        Row(
            "duplicates",
            _duplicates(new),
            None if base is None else _duplicates(base),
            "runs",
            compared=False,
        ),
        Row(
            "started before their instant",
            new["early"],
            b("early"),
            "runs",
            compared=False,
        ),
    ]
    against = "" if base is None else f" vs previous {base['settings']}"
    print_table(
        f"start lag: {new['jobs']} jobs every {args.every} ({new['jobs']} runs per instant), "
        f"one replica; {new['variant']} {new['settings']}{against}",
        rows,
        [
            f"machine: {new['environment']}; load (1 min) {new['load_before'][0]:.2f} at start",
            "goal: p50 < 15 ms, p99 < 50 ms, max < 200 ms, 0 missed, 0 duplicates",
        ],
    )


async def _child_main(args: argparse.Namespace) -> None:
    result = await child(args)
    print_result(result)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="100,500", help="comma-separated job counts")
    parser.add_argument("--every", default="1s", help="each job's interval")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the window")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="worker_concurrency for both configurations (0: claimd's default)",
    )
    parser.add_argument(
        "--variants",
        default="new,previous",
        help=f"comma-separated, of: {', '.join(VARIANTS)} (each against previous)",
    )
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        args.jobs = int(args.jobs)
        asyncio.run(_child_main(args))
        return
    variants = [v for v in args.variants.split(",") if v]
    for jobs in (int(j) for j in args.jobs.split(",") if j):
        results = {v: run_child_variant(v, jobs, args) for v in variants}
        base = results.get("previous")
        for name, result in results.items():
            if name != "previous" or len(results) == 1:
                report(result, None if result is base else base, args)


if __name__ == "__main__":
    main()

"""Claim: ``claim_due_runs`` with a batch of 500 against a batch of 1, on real PostgreSQL.

Seeds ``--jobs`` x ``--per-job`` pending runs that are already due, then claims
them all with one claimer and with ``--claimers`` concurrent claimers, each
time with the batched statement (``--batch``, 500 by default, the shipped
``claim_batch``) and with a batch of 1 (the naive baseline: one statement per
run). The baseline stops after ``--baseline-seconds`` so the default run stays
short; its rate is claimed runs over the time it ran.

Also prints whether any run was claimed twice (SKIP LOCKED keeps concurrent
claims disjoint) and how a claim's latency grows with the number of runs
already claimed (the in-flight bound counts them on every claim).

    python -m bench.bench_claim [--per-job 200 --jobs 100 --claimers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.adapters.postgres import PostgresRunStore
from bench.common import (
    Row,
    bench_schema,
    environment,
    migrated_store,
    print_table,
    reseed_due_runs,
    seed_jobs,
)

LEASE = timedelta(minutes=10)


@dataclass
class ClaimResult:
    claimers: int
    batch: int
    seeded: int
    claimed_ids: list[str] = field(default_factory=list)
    seconds: float = 0.0
    statements: int = 0
    # (runs already claimed before the call, seconds) for every claim statement
    latencies: list[tuple[int, float]] = field(default_factory=list)
    in_db: int = 0

    @property
    def rate(self) -> float:
        return len(self.claimed_ids) / self.seconds if self.seconds else 0.0

    @property
    def claimed_twice(self) -> int:
        return len(self.claimed_ids) - len(set(self.claimed_ids))


async def _claim_until_empty(
    store: PostgresRunStore,
    owner: str,
    batch: int,
    max_claimed: int,
    deadline: float,
    result: ClaimResult,
) -> None:
    while time.perf_counter() < deadline:
        before = len(result.claimed_ids)
        start = time.perf_counter()
        runs = await store.claim_due_runs(owner, batch, LEASE, max_claimed)
        result.latencies.append((before, time.perf_counter() - start))
        result.statements += 1
        if not runs:
            return
        result.claimed_ids.extend(r.run_id for r in runs)


async def run_variant(
    url: str, job_ids: list[int], per_job: int, *, claimers: int, batch: int, budget: float
) -> ClaimResult:
    # A fresh pool per variant, as a fresh replica would have: no variant
    # inherits another's cached (prepared, possibly generic) query plans.
    store = await PostgresRunStore.connect(url, min_size=claimers + 1, max_size=claimers + 1)
    try:
        seeded = await reseed_due_runs(store, job_ids, per_job)
        result = ClaimResult(claimers=claimers, batch=batch, seeded=seeded)
        # The in-flight bound is set above the backlog: this measures the claim
        # statement, not the bound holding it back.
        max_claimed = seeded + 1
        start = time.perf_counter()
        deadline = start + budget
        async with asyncio.TaskGroup() as group:
            for i in range(claimers):
                group.create_task(
                    _claim_until_empty(
                        store, f"bench-claimer-{i}", batch, max_claimed, deadline, result
                    )
                )
        result.seconds = time.perf_counter() - start
        result.in_db = await store.pool.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'claimed'"
        )
        return result
    finally:
        await store.close()


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


async def main(args: argparse.Namespace) -> None:
    async with bench_schema() as url, migrated_store(url, max_size=2) as store:
        print(await environment(store.pool))
        job_ids = await seed_jobs(store, args.jobs)
        print(
            f"backlog: {args.jobs} jobs x {args.per_job} due runs = "
            f"{args.jobs * args.per_job} runs; batch {args.batch} vs 1; "
            f"baseline budget {args.baseline_seconds}s"
        )
        results: dict[tuple[int, int], ClaimResult] = {}
        for claimers in (1, args.claimers):
            for batch, budget in ((args.batch, args.max_seconds), (1, args.baseline_seconds)):
                r = await run_variant(
                    url, job_ids, args.per_job, claimers=claimers, batch=batch, budget=budget
                )
                results[(claimers, batch)] = r
                print(
                    f"  {claimers} claimer(s), batch {batch:>3}: {len(r.claimed_ids):>6} of "
                    f"{r.seeded} claimed in {r.seconds:5.2f}s with {r.statements} statements; "
                    f"claimed twice: {r.claimed_twice}; rows in state claimed: {r.in_db}"
                )
        # How one claim's cost grows with the due backlog: a small backlog
        # against the full one, batch 1, 100 claims each, fresh pools.
        small_per_job = max(1, min(args.per_job, 500 // max(1, args.jobs)))
        by_backlog = {}
        for per_job in (small_per_job, args.per_job):
            r = await run_variant(
                url, job_ids, per_job, claimers=1, batch=1, budget=args.baseline_seconds
            )
            by_backlog[r.seeded] = r.latencies[:100]

    rows: list[Row] = []
    for claimers in (1, args.claimers):
        big, one = results[(claimers, args.batch)], results[(claimers, 1)]
        rows.append(Row(f"{claimers} claimer(s): runs claimed/s", big.rate, one.rate, "runs/s"))
        rows.append(
            Row(
                f"{claimers} claimer(s): median claim latency",
                _median_ms([s for _, s in big.latencies]),
                _median_ms([s for _, s in one.latencies]),
                "ms/statement",
                compared=False,
            )
        )
    single = results[(1, args.batch)]
    early = [s for n, s in single.latencies if n < args.batch * 4]
    late = [s for n, s in single.latencies if n >= single.seeded - args.batch * 4]
    (small, small_lat), (full, full_lat) = sorted(by_backlog.items())
    notes = [
        f"figure = batch {args.batch}, baseline = batch 1 (one statement per run)",
        f"batch-1 claim latency with {small} due runs: "
        f"{_median_ms([s for _, s in small_lat]):.2f} ms; with {full} due runs: "
        f"{_median_ms([s for _, s in full_lat]):.2f} ms (median of the first 100 claims)",
        f"batch-{args.batch} claim latency with <{args.batch * 4} runs already claimed: "
        f"{_median_ms(early):.1f} ms; with ~{single.seeded} already claimed: "
        f"{_median_ms(late):.1f} ms (the in-flight bound counts claimed rows every claim)",
        f"runs claimed twice across all variants: {sum(r.claimed_twice for r in results.values())}",
    ]
    print_table("claim_due_runs", rows, notes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs the runs belong to")
    parser.add_argument("--per-job", type=int, default=200, help="due runs per job")
    parser.add_argument("--batch", type=int, default=500, help="the batched claim size")
    parser.add_argument("--claimers", type=int, default=4, help="concurrent claimers")
    parser.add_argument(
        "--baseline-seconds", type=float, default=6.0, help="time budget of each batch-1 baseline"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=60.0, help="time budget of each batched run"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

"""Complete: ``PostgresRunStore.complete_runs`` batched against one completion per statement.

Seeds ``--jobs`` x ``--per-job`` runs, moves them to ``running`` under a fresh
claim epoch (direct SQL in the benchmark's own schema, as claim + start would
leave them), then records a success for each: in statements of ``--batch``
completions (256 is the worker's COMPLETION_BATCH; 100 is also measured), and
one completion per statement, awaited one at a time (the naive baseline) and
``--concurrency`` at a time (a naive worker completing each run in its own
task). Baselines stop after ``--baseline-seconds``.

Every variant also reports how many completions were recorded and how many
attempt rows exist, which must both equal the completions sent.

    python -m bench.bench_complete [--per-job 200 --batch 256]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.adapters.postgres import PostgresRunStore
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion
from bench.common import (
    Row,
    bench_schema,
    environment,
    migrated_store,
    print_table,
    reseed_due_runs,
    seed_jobs,
)

# What claim_due_runs + start_runs leave behind: running, leased, epoch moved on.
MAKE_RUNNING = """
UPDATE job_runs
   SET state = 'running', claim_epoch = claim_epoch + 1, attempt = 1,
       lease_owner = 'bench-worker', lease_expires_at = now() + interval '1 hour',
       claimed_at = now(), started_at = now(), updated_at = now()
 WHERE state = 'pending'
RETURNING id::text, claim_epoch
"""


@dataclass
class CompleteResult:
    name: str
    sent: int
    recorded: int
    seconds: float
    attempts_in_db: int
    succeeded_in_db: int

    @property
    def rate(self) -> float:
        return self.recorded / self.seconds if self.seconds else 0.0


async def _running_completions(
    store: PostgresRunStore, job_ids: Sequence[int], per_job: int
) -> list[Completion]:
    await reseed_due_runs(store, job_ids, per_job)
    rows = await store.pool.fetch(MAKE_RUNNING)
    await store.pool.execute("VACUUM ANALYZE job_runs")
    result = ExecutionResult(Outcome.SUCCEEDED, exit_code=0, duration=timedelta(milliseconds=3))
    return [Completion(r["id"], r["claim_epoch"], result, None, "bench-worker") for r in rows]


async def run_variant(
    store: PostgresRunStore,
    job_ids: Sequence[int],
    per_job: int,
    *,
    name: str,
    per_statement: int,
    concurrency: int,
    budget: float,
) -> CompleteResult:
    completions = await _running_completions(store, job_ids, per_job)
    chunks = [completions[i : i + per_statement] for i in range(0, len(completions), per_statement)]
    recorded = 0
    sent = 0
    start = time.perf_counter()
    deadline = start + budget

    async def lane(lane_chunks: list[list[Completion]]) -> None:
        nonlocal recorded, sent
        for chunk in lane_chunks:
            if time.perf_counter() >= deadline:
                return
            sent += len(chunk)
            # Await first: `recorded += len(await ...)` would read `recorded`
            # before the await and lose the other lanes' counts.
            done = len(await store.complete_runs(chunk))
            recorded += done

    # Each lane completes its share in order, one statement at a time.
    async with asyncio.TaskGroup() as group:
        for i in range(concurrency):
            group.create_task(lane(chunks[i::concurrency]))
    seconds = time.perf_counter() - start
    attempts = await store.pool.fetchval("SELECT count(*) FROM job_run_attempts")
    succeeded = await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
    return CompleteResult(name, sent, recorded, seconds, attempts, succeeded)


async def main(args: argparse.Namespace) -> None:
    async with (
        bench_schema() as url,
        migrated_store(url, max_size=max(2, args.concurrency)) as store,
    ):
        print(await environment(store.pool))
        job_ids = await seed_jobs(store, args.jobs)
        print(
            f"{args.jobs * args.per_job} running runs per variant; baselines stop after "
            f"{args.baseline_seconds}s"
        )
        variants = [
            (f"batch {args.batch}", args.batch, 1, args.max_seconds),
            ("batch 100", 100, 1, args.max_seconds),
            ("1 per statement", 1, 1, args.baseline_seconds),
            (
                f"1 per statement, {args.concurrency} concurrent",
                1,
                args.concurrency,
                args.baseline_seconds,
            ),
        ]
        results: dict[str, CompleteResult] = {}
        for name, per_statement, concurrency, budget in variants:
            r = await run_variant(
                store,
                job_ids,
                args.per_job,
                name=name,
                per_statement=per_statement,
                concurrency=concurrency,
                budget=budget,
            )
            results[name] = r
            print(
                f"  {name:<28} {r.recorded:>6} recorded of {r.sent:>6} sent in "
                f"{r.seconds:5.2f}s; attempt rows {r.attempts_in_db}, "
                f"succeeded rows {r.succeeded_in_db}"
            )
    one = results["1 per statement"]
    many = results[f"1 per statement, {args.concurrency} concurrent"]
    batched = results[f"batch {args.batch}"]
    rows = [
        Row(f"batch {args.batch} vs 1 per statement", batched.rate, one.rate, "completions/s"),
        Row("batch 100 vs 1 per statement", results["batch 100"].rate, one.rate, "completions/s"),
        Row(
            f"batch {args.batch} vs 1 per stmt x{args.concurrency} concurrent",
            batched.rate,
            many.rate,
            "completions/s",
        ),
    ]
    mismatched = sum(
        1
        for r in results.values()
        if not (r.recorded == r.sent == r.attempts_in_db == r.succeeded_in_db)
    )
    print_table(
        "complete_runs",
        rows,
        [
            "figure = batched, sequential statements (as the worker's completion loop runs them)",
            f"variants where recorded, attempt rows and succeeded rows differ from sent: "
            f"{mismatched}",
        ],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--per-job", type=int, default=200)
    parser.add_argument(
        "--batch",
        type=int,
        default=256,
        help="completions per statement (the worker uses up to 256)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=10,
        help="concurrent single-completion statements in the second baseline",
    )
    parser.add_argument("--baseline-seconds", type=float, default=6.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

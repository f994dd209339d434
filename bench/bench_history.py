"""Claim latency against the terminal history and the due backlog, on real PostgreSQL.

A claim must cost the same with 0 or 1,000,000 terminal rows in ``job_runs``
and with a due backlog of a few thousand or 100,000 runs: it reads the
oldest due rows up to its batch, never the history nor the whole backlog.

Seeds ``--jobs`` jobs, then for each case (history rows / due runs) times
``--claims`` calls of the claimer's pass: ``skip_unrunnable`` (nothing to
skip: the due runs are inside the start deadline) then ``claim_due_runs``
with the batch (``--batch``, 500 as shipped) and with a batch of 1. After
each claim, untimed, the claimed runs are recorded succeeded and as many new
due runs inserted, as workers and the materializer would: every claim meets
the same due set and in-flight count. Rows are seeded with
``INSERT ... SELECT generate_series`` and the table is vacuumed and analyzed
before each case. Prints median and p99 per case and the ratio to the
first case (no history, the small due set): 1.0x is flat.

    python -m bench.bench_history                       # ~1-2 min
    python -m bench.bench_history --history 200000 --backlog 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.adapters.postgres import CLAIM_DUE_RUNS, PostgresRunStore
from actors.adapters.postgres.statements import claim
from bench.common import bench_schema, environment, migrated_store, percentile, seed_jobs

LEASE = timedelta(minutes=10)
MAX_CLAIMED = 1_000_000  # the bound is not what is measured here
SEED_S = 900.0  # seeding a million rows takes longer than the store's statement timeout

# Terminal runs of the last 30 days, spread over the jobs, mostly succeeded.
SEED_HISTORY = """
INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, attempt, claim_epoch,
                      claimed_at, started_at, finished_at)
SELECT j, t, t, s, s, 1, 1, t, t, t + interval '50 ms'
  FROM (SELECT ($1::bigint[])[1 + g % cardinality($1::bigint[])] AS j,
               now() - interval '30 days' + (g / cardinality($1::bigint[]))
                   * (interval '30 days' / ($2::int / cardinality($1::bigint[]) + 1)) AS t,
               CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'succeeded' END AS s
          FROM generate_series(0, $2::int - 1) AS g) x
"""
# Due runs scheduled over the last ten minutes: inside the default start deadline.
SEED_DUE = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT j, t, t
  FROM (SELECT ($1::bigint[])[1 + g % cardinality($1::bigint[])] AS j,
               now() - interval '10 minutes' + (g / cardinality($1::bigint[]))
                   * (interval '10 minutes' / ($2::int / cardinality($1::bigint[]) + 1)) AS t
          FROM generate_series(0, $2::int - 1) AS g) x
"""
DONE = """
UPDATE job_runs SET state = 'succeeded', outcome = 'succeeded', lease_owner = NULL,
       lease_expires_at = NULL, started_at = now(), finished_at = now()
 WHERE id = ANY ($1::uuid[])
"""


# The claim as it was before it looked the job up per due row (commit 87431b1):
# joined to jobs, it let the planner read each job's whole pending range and
# sort. Kept here only to print both in the same run.
PREVIOUS_CLAIM_DUE_RUNS = (
    """
WITH due AS (
    SELECT r.id, """
    + claim.MUST_NOT_RUN
    + """ AS skip
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE r.state = 'pending' AND r.due_at <= now() AND j.enabled AND NOT j.paused
       AND j.overlap = 'allow'
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
     LIMIT $2
)"""
    + claim._CLAIM_OR_SKIP % {"exclusive": "false"}
)
REFILL = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT ($1::bigint[])[1 + g % cardinality($1::bigint[])],
       clock_timestamp() - interval '1 minute' + g * interval '1 microsecond',
       clock_timestamp() - interval '1 minute' + g * interval '1 microsecond'
  FROM generate_series(1, $2::int) AS g
"""


async def _explain(store: PostgresRunStore, batch: int, sql: str) -> tuple[float, int]:
    """A claim's execution time and buffers touched, rolled back: the load-proof figure."""
    async with store.pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()
        try:
            plan = json.loads(
                await conn.fetchval(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql,
                    "bench",
                    batch,
                    LEASE,
                    # claim_ahead: today's statement has it ($4), the one before did not
                    *((timedelta(0),) if "$4" in sql else ()),
                )
            )[0]
        finally:
            await tr.rollback()
    top = plan["Plan"]
    return plan["Execution Time"], top["Shared Hit Blocks"] + top["Shared Read Blocks"]


async def _case(
    store: PostgresRunStore, jobs: list[int], history: int, due: int, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, tuple[float, int]]]:
    pool = store.pool
    async with pool.acquire() as conn:
        await conn.execute(
            "DELETE FROM job_runs WHERE state IN ('pending', 'claimed', 'running')", timeout=SEED_S
        )
        have = await conn.fetchval("SELECT count(*) FROM job_runs")
        if have > history:
            await conn.execute("TRUNCATE job_runs CASCADE")
            have = 0
        if history > have:
            await conn.execute(SEED_HISTORY, jobs, history - have, timeout=SEED_S)
        await conn.execute(SEED_DUE, jobs, due, timeout=SEED_S)
        await conn.execute("VACUUM ANALYZE job_runs", timeout=SEED_S)

    async def claims(batch: int) -> list[float]:
        out: list[float] = []
        for _ in range(args.claims):
            t0 = time.perf_counter()
            runs = await store.claim_due_runs("bench", batch, LEASE, MAX_CLAIMED)
            out.append(time.perf_counter() - t0)
            # Untimed: the workers record them, and as many new runs fall due,
            # so every claim meets the same due set and in-flight count.
            await pool.execute(DONE, [r.run_id for r in runs])
            await pool.execute(REFILL, jobs, len(runs))
        return out

    for _ in range(3):  # warm: prepared statements, caches
        await store.skip_unrunnable(500)
        runs = await store.claim_due_runs("bench", args.batch, LEASE, MAX_CLAIMED)
        await pool.execute(DONE, [r.run_id for r in runs])
        await pool.execute(REFILL, jobs, len(runs))
    skips: list[float] = []
    for _ in range(args.claims):
        t0 = time.perf_counter()
        await store.skip_unrunnable(500)
        skips.append(time.perf_counter() - t0)
    figures = {
        "skip_unrunnable": skips,
        f"claim batch {args.batch}": await claims(args.batch),
        "claim batch 1": await claims(1),
    }
    plans = {}
    for label, sql in (("now", CLAIM_DUE_RUNS), ("before", PREVIOUS_CLAIM_DUE_RUNS)):
        for batch in (args.batch, 1):
            plans[f"{label} LIMIT {batch}"] = await _explain(store, batch, sql)
    return figures, plans


async def main(args: argparse.Namespace) -> None:
    cases = [
        (0, args.small),
        (args.history, args.small),
        (0, args.backlog),
        (args.history, args.backlog),
    ]
    results: list[tuple[int, int, dict[str, list[float]], dict[str, tuple[float, int]]]] = []
    async with bench_schema() as url, migrated_store(url) as store:
        env = await environment(store.pool)
        jobs = await seed_jobs(store, args.jobs)
        # No history first, then the same cases with it (seeded once, kept).
        for history, due in sorted(cases, key=lambda c: (c[0], c[1])):
            t0 = time.perf_counter()
            figures, plans = await _case(store, jobs, history, due, args)
            print(
                f"  case {history:,} terminal / {due:,} due measured "
                f"({time.perf_counter() - t0:.0f} s with seeding)",
                file=sys.stderr,
            )
            results.append((history, due, figures, plans))
    order = {c: i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[(r[0], r[1])])
    base = results[0][2]
    print(
        f"\nclaim latency vs terminal history and due backlog ({args.jobs} jobs, "
        f"{args.claims} calls each; ratio = median / median of the first case)"
    )
    head = f"{'terminal rows':>13}  {'due runs':>8}  {'statement':<18}  {'median ms':>9}  "
    head += f"{'p99 ms':>7}  {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for history, due, figures, _ in results:
        for name, times in figures.items():
            med = 1000 * percentile(times, 50)
            ratio = med / (1000 * percentile(base[name], 50))
            print(
                f"{history:>13,}  {due:>8,}  {name:<18}  {med:9.2f}  "
                f"{1000 * percentile(times, 99):7.2f}  {ratio:5.2f}x"
            )
    print(
        "\nCLAIM_DUE_RUNS alone, now and before this change, EXPLAIN (ANALYZE, BUFFERS) in a "
        "rolled-back transaction (blk = buffers touched; ratio to the first case)"
    )
    base_plans = results[0][3]
    for history, due, _, explain in results:
        for b, (ms, blocks) in explain.items():
            print(
                f"{history:>13,}  {due:>8,}  {b:<18}  {ms:9.2f}  {blocks:9,} blocks  "
                f"{blocks / base_plans[b][1]:5.2f}x"
            )
    print(f"  machine: {env}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--history", type=int, default=1_000_000, help="terminal rows")
    parser.add_argument("--backlog", type=int, default=100_000, help="due runs, large case")
    parser.add_argument("--small", type=int, default=1_000, help="due runs, small case")
    parser.add_argument("--claims", type=int, default=25, help="calls timed per statement")
    parser.add_argument("--batch", type=int, default=500)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

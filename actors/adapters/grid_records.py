"""PostgreSQL: the rows and gaps of many jobs' recent ranges, for the run grid.

The grid judges each job's last instants as the audit does, from the job's
rows and recorded gaps over a range that differs per job. Read a job at a
time, 1,000 jobs were 2,000 statements and 1,000 transactions (3-5 s); here
each kind is one statement over every job's range, read in one snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from actors.domain import RunState
from actors.domain.history import Gap, RunRecord

# Each job's rows in [its start, $3], at most $4 of them (the audit's bound),
# through the (job_id, scheduled_at) index.
GRID_RUNS = """
SELECT u.job_id, r.id::text AS id, r.scheduled_at, r.state, r.trigger, r.attempt, r.error,
       r.lease_expires_at
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(job_id, from_at)
  CROSS JOIN LATERAL (SELECT id, scheduled_at, state, trigger, attempt, error, lease_expires_at
                        FROM job_runs
                       WHERE job_id = u.job_id AND scheduled_at BETWEEN u.from_at AND $3
                       ORDER BY scheduled_at LIMIT $4) r
 ORDER BY u.job_id, r.scheduled_at
"""
GRID_GAPS = """
SELECT g.job_id, g.from_at, g.to_at, g.count, g.reason
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(job_id, from_at)
  JOIN job_run_gaps g ON g.job_id = u.job_id AND g.from_at <= $3 AND g.to_at >= u.from_at
 ORDER BY g.job_id, g.from_at
"""

# The pauses and resumes that took effect, of every job named, in order.
GRID_PAUSES = """
SELECT job, action, at FROM operator_actions
 WHERE job = ANY ($1::text[]) AND action IN ('pause', 'resume') AND ok ORDER BY id
"""

Records = tuple[list[RunRecord], list[Gap]]


async def grid_records(
    pool: asyncpg.Pool, ranges: Sequence[tuple[int, datetime]], end: datetime, limit: int
) -> dict[int, Records]:
    """Each job's rows and gaps in ``[start, end]``, by job id (``ranges``: (job id, start))."""
    out: dict[int, Records] = {job_id: ([], []) for job_id, _ in ranges}
    if not ranges:
        return out
    ids = [job_id for job_id, _ in ranges]
    starts = [start for _, start in ranges]
    async with (
        pool.acquire() as conn,
        conn.transaction(isolation="repeatable_read", readonly=True),
    ):
        rows = await conn.fetch(GRID_RUNS, ids, starts, end, limit)
        gaps = await conn.fetch(GRID_GAPS, ids, starts, end)
    for r in rows:
        out[r["job_id"]][0].append(
            RunRecord(
                run_id=r["id"],
                scheduled_at=r["scheduled_at"],
                state=RunState(r["state"]),
                trigger=r["trigger"],
                attempt=r["attempt"],
                error=r["error"],
                lease_expires_at=r["lease_expires_at"],
            )
        )
    for g in gaps:
        out[g["job_id"]][1].append(Gap(g["from_at"], g["to_at"], g["count"], g["reason"]))
    return out


async def paused_spans_of(
    pool: asyncpg.Pool, jobs: Sequence[str]
) -> dict[str, list[tuple[datetime, datetime | None]]]:
    """Each job's spans from a pause to its resume (None: still paused), by job name."""
    actions: dict[str, list[tuple[str, datetime]]] = {}
    for row in await pool.fetch(GRID_PAUSES, list(jobs)):
        actions.setdefault(row["job"], []).append((row["action"], row["at"]))
    return {job: pause_spans(found) for job, found in actions.items()}


def pause_spans(actions: Sequence[tuple[str, datetime]]) -> list[tuple[datetime, datetime | None]]:
    """From each pause to its resume, in the order the action log has them."""
    spans: list[tuple[datetime, datetime | None]] = []
    since: datetime | None = None
    for action, at in actions:
        if action == "pause" and since is None:
            since = at
        elif action == "resume" and since is not None:
            spans.append((since, at))
            since = None
    if since is not None:
        spans.append((since, None))
    return spans

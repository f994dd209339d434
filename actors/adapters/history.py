"""PostgreSQL: what happened (runs, attempts, gaps) and who did what (operator actions).

The read side an operator uses, and the two writes that keep history without
silent holes: the gaps a plan drops (written in the plan's own transaction)
and the operator actions. Every statement is a named, parameterised constant.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from actors.adapters.grid_records import pause_spans
from actors.domain import RunState
from actors.domain.history import Gap, RunRecord

TERMINAL = ["succeeded", "failed", "skipped", "cancelled"]

# --- written by the materializer, in the transaction that writes the plan ------

# A gap is written only for jobs whose plan is current (the ids the guarded
# high-water update returned, which also row-locks them), and only where no
# gap of the job overlaps it yet: two replicas that planned from the same mark
# take the lock one after the other, so the second sees the first's gap. The
# instants that one's range has and the other's lacks were future instants to
# the other, which wrote them as rows.
RECORD_GAPS = """
INSERT INTO job_run_gaps (job_id, from_at, to_at, count, reason)
SELECT u.job_id, u.from_at, u.to_at, u.count, u.reason
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], $5::text[])
       AS u(job_id, from_at, to_at, count, reason)
 WHERE u.job_id = ANY ($6::bigint[])
   AND NOT EXISTS (SELECT 1 FROM job_run_gaps g
                    WHERE g.job_id = u.job_id AND g.from_at <= u.to_at AND g.to_at >= u.from_at)
RETURNING job_id, count
"""


async def record_gaps(
    conn: asyncpg.Connection, current: Sequence[int], gaps: Sequence[tuple[int, Gap]]
) -> dict[int, int]:
    """Write the gaps of the plans being written (``current``: the job ids still current).

    Returns the instants recorded missed, by job id: none for a gap already recorded.
    """
    if not gaps:
        return {}
    rows = await conn.fetch(
        RECORD_GAPS,
        [job for job, _ in gaps],
        [g.first for _, g in gaps],
        [g.last for _, g in gaps],
        [g.count for _, g in gaps],
        [g.reason for _, g in gaps],
        list(current),
    )
    missed: dict[int, int] = {}
    for row in rows:
        missed[row["job_id"]] = missed.get(row["job_id"], 0) + row["count"]
    return missed


# --- reads ---------------------------------------------------------------------

DB_NOW = "SELECT now()"

# One row per job; each figure is one index range of that job's rows. The last
# outcome is over instants at or before now: a future run cancelled (by a
# removal, say) has not happened.
# The backlog is what is due and not started (pending or claimed, due_at past),
# apart from the look-ahead the materializer writes ahead of time.
JOBS_OVERVIEW = """
SELECT j.id, j.name, j.definition, j.enabled, j.paused, j.created_at, j.history_pruned_through,
       COALESCE(j.planned_since, j.created_at) AS due_since,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       b.backlog, b.oldest_due, a.ahead, x.running,
       lt.id::text AS last_run_id, lt.state AS last_state, lt.outcome AS last_outcome,
       lt.error AS last_error, lt.scheduled_at AS last_scheduled_at,
       lt.finished_at AS last_finished_at, lt.trigger AS last_trigger,
       ls.finished_at AS last_success, f.failures_24h
  FROM jobs j
  LEFT JOIN LATERAL (SELECT count(*) AS backlog, min(r.due_at) AS oldest_due FROM job_runs r
                      WHERE r.job_id = j.id AND r.state IN ('pending', 'claimed')
                        AND r.due_at <= now()) b ON true
  LEFT JOIN LATERAL (SELECT count(*) AS ahead FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'pending' AND r.due_at > now()) a ON true
  LEFT JOIN LATERAL (SELECT count(*) AS running FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'running') x ON true
  LEFT JOIN LATERAL (SELECT r.id, r.state, r.outcome, r.error, r.scheduled_at, r.finished_at,
                            r.trigger
                       FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = ANY ($2::text[])
                        AND r.scheduled_at <= now()
                      ORDER BY r.scheduled_at DESC LIMIT 1) lt ON true
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'succeeded'
                      ORDER BY r.scheduled_at DESC LIMIT 1) ls ON true
  LEFT JOIN LATERAL (SELECT count(*) AS failures_24h FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'failed'
                        AND r.scheduled_at > now() - interval '24 hours') f ON true
 WHERE ($1::text IS NULL OR j.name = $1)
 ORDER BY j.name
"""
# Newest first, a page at a time: the cursor is the last row's (scheduled_at, id).
# What has happened (scheduled at or before now) unless $8 asks for the
# look-ahead too: the rows the materializer writes ahead would otherwise open
# every listing of a frequent job.
RUNS_PAGE = """
SELECT r.id::text AS id, j.name AS job,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       r.scheduled_at, r.due_at, r.state, r.trigger, r.attempt, r.claim_epoch, r.lease_owner,
       r.lease_expires_at, r.claimed_at, r.started_at, r.finished_at, r.outcome, r.exit_code,
       r.error, r.created_at, r.updated_at
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE ($1::bigint IS NULL OR r.job_id = $1)
   AND ($2::text[] IS NULL OR r.state = ANY ($2))
   AND ($3::timestamptz IS NULL OR r.scheduled_at >= $3)
   AND ($4::timestamptz IS NULL OR r.scheduled_at <= $4)
   AND ($5::timestamptz IS NULL OR (r.scheduled_at, r.id) < ($5, $6::uuid))
   AND ($8 OR r.scheduled_at <= now())
 ORDER BY r.scheduled_at DESC, r.id DESC
 LIMIT $7
"""
RUN_DETAIL = """
SELECT r.id::text AS id, j.name AS job,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       r.scheduled_at, r.due_at, r.state, r.trigger, r.attempt, r.claim_epoch, r.lease_owner,
       r.lease_expires_at, r.claimed_at, r.started_at, r.finished_at, r.outcome, r.exit_code,
       r.error, r.created_at, r.updated_at,
       r.output_tail, now() AS now
  FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE r.id = $1::uuid
"""
RUN_ATTEMPTS = """
SELECT attempt, claim_epoch, worker, started_at, finished_at, outcome, exit_code, error
  FROM job_run_attempts WHERE run_id = $1::uuid ORDER BY finished_at, claim_epoch
"""
JOB_BY_NAME = """
SELECT j.id, j.name, j.definition, j.enabled, j.paused, j.history_pruned_through,
       COALESCE(j.planned_since, j.created_at) AS due_since,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone, now() AS now
  FROM jobs j WHERE j.name = $1
"""
AUDIT_RUNS = """
SELECT id::text AS id, scheduled_at, state, trigger, attempt, error, lease_expires_at
  FROM job_runs WHERE job_id = $1 AND scheduled_at BETWEEN $2 AND $3
 ORDER BY scheduled_at LIMIT $4
"""
AUDIT_GAPS = """
SELECT from_at, to_at, count, reason FROM job_run_gaps
 WHERE job_id = $1 AND from_at <= $3 AND to_at >= $2 ORDER BY from_at
"""
# The jobs the config file rejected at the last load (sql/0011). One that is in
# the catalog and enabled still runs the definition it had before the edit.
REJECTED_JOBS = """
SELECT c.job, c.path, c.field, c.error, c.replica, c.recorded_at,
       COALESCE(j.enabled, false) AS old_definition_running
  FROM config_rejected_jobs c LEFT JOIN jobs j ON j.name = c.job
 ORDER BY c.job
"""
# A job's pauses and resumes that took effect, in order: the spans the audit
# calls "paused" rather than "missing".
PAUSES = """
SELECT action, at FROM operator_actions
 WHERE job = $1 AND action IN ('pause', 'resume') AND ok ORDER BY id
"""
RECORD_ACTION = """
INSERT INTO operator_actions (actor, via, origin, action, job, run_id, arguments, ok, result)
VALUES ($1, $2, $3, $4, $5, $6::uuid, $7::jsonb, $8, $9)
RETURNING id, at
"""
ACTIONS_PAGE = """
SELECT id, at, actor, via, origin, action, job, run_id::text AS run_id, arguments, ok, result
  FROM operator_actions
 WHERE ($1::text IS NULL OR job = $1) AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC LIMIT $3
"""
LAST_ACTION_ID = "SELECT COALESCE(max(id), 0) FROM operator_actions"
# What a replica recorded after a SIGHUP from this pid, newer than a given action.
RELOAD_VERDICT = """
SELECT id, ok, result, arguments FROM operator_actions
 WHERE action = 'reload' AND via = 'signal' AND id > $1 AND arguments ->> 'pid' = $2
 ORDER BY id LIMIT 1
"""


@dataclass(frozen=True)
class Actor:
    """Who asked for an action, and how."""

    name: str  # OS user or --actor (CLI), the token's name (API)
    via: str  # cli | http | signal
    origin: str | None = None


class History:
    """Reads of runs, attempts, gaps and actions; the record of operator actions."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def now(self) -> datetime:
        now: datetime = await self._pool.fetchval(DB_NOW)
        return now

    async def jobs(self, name: str | None = None) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._pool.fetch(JOBS_OVERVIEW, name, TERMINAL)]

    async def job(self, name: str) -> dict[str, Any] | None:
        row = await self._pool.fetchrow(JOB_BY_NAME, name)
        return None if row is None else dict(row)

    async def runs(
        self,
        *,
        job_id: int | None = None,
        states: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
        ahead: bool = False,
    ) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(
            RUNS_PAGE,
            job_id,
            list(states) if states else None,
            since,
            until,
            before[0] if before else None,
            before[1] if before else None,
            limit,
            ahead,
        )
        return [dict(r) for r in rows]

    async def run(self, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(RUN_DETAIL, run_id)
            if row is None:
                return None
            attempts = await conn.fetch(RUN_ATTEMPTS, run_id)
        return dict(row), [dict(a) for a in attempts]

    async def audit_records(
        self, job_id: int, start: datetime, end: datetime, limit: int
    ) -> tuple[list[RunRecord], list[Gap]]:
        """The rows and gaps of a job in ``[start, end]``, read in one snapshot."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            rows = await conn.fetch(AUDIT_RUNS, job_id, start, end, limit)
            gaps = await conn.fetch(AUDIT_GAPS, job_id, start, end)
        runs = [
            RunRecord(
                run_id=r["id"],
                scheduled_at=r["scheduled_at"],
                state=RunState(r["state"]),
                trigger=r["trigger"],
                attempt=r["attempt"],
                error=r["error"],
                lease_expires_at=r["lease_expires_at"],
            )
            for r in rows
        ]
        return runs, [Gap(g["from_at"], g["to_at"], g["count"], g["reason"]) for g in gaps]

    async def paused_spans(self, job: str) -> list[tuple[datetime, datetime | None]]:
        """From each pause to its resume (None: still paused), as the action log says."""
        return pause_spans([(r["action"], r["at"]) for r in await self._pool.fetch(PAUSES, job)])

    async def rejected_jobs(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._pool.fetch(REJECTED_JOBS)]

    async def last_action_id(self) -> int:
        last: int = await self._pool.fetchval(LAST_ACTION_ID)
        return last

    async def reload_verdict(self, pid: int, after: int) -> tuple[bool, str, dict[str, Any]] | None:
        """What replica ``pid`` recorded for a reload after action ``after``, if anything yet:
        ok, the result, and what it changed or each error (actors.replica.reload)."""
        row = await self._pool.fetchrow(RELOAD_VERDICT, after, str(pid))
        if row is None:
            return None
        raw = row["arguments"]
        details = json.loads(raw) if isinstance(raw, str) else raw
        return row["ok"], row["result"], details if isinstance(details, dict) else {}

    async def actions(
        self, *, job: str | None = None, before: int | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._pool.fetch(ACTIONS_PAGE, job, before, limit)]


async def record_action(
    conn: asyncpg.Connection | asyncpg.Pool,
    actor: Actor,
    action: str,
    *,
    job: str | None = None,
    run_id: str | None = None,
    arguments: dict[str, Any] | None = None,
    ok: bool,
    result: str,
) -> tuple[int, datetime]:
    """Write one operator action (in the caller's transaction when given a connection)."""
    args = json.dumps(arguments or {}, default=str, ensure_ascii=False)
    if len(args) > 4000:  # cut as text, not mid-JSON
        args = json.dumps({"truncated": args[:3900]}, ensure_ascii=False)
    row = await conn.fetchrow(
        RECORD_ACTION,
        _text(actor.name, 200),
        actor.via,
        _text(actor.origin, 200),
        action,
        _text(job, 200),
        run_id,
        _text(args, 8000),
        ok,
        _text(result, 2000),
    )
    assert row is not None
    return row["id"], row["at"]


def _text(value: str | None, limit: int) -> str | None:
    """What an operator typed, storable: PostgreSQL text holds no NUL and no lone surrogate."""
    if value is None:
        return None
    clean = value.replace("\x00", "\ufffd").replace("\\u0000", "\\ufffd")
    clean = clean.encode("utf-8", "replace").decode("utf-8")
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"

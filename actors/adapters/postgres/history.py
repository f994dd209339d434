"""PostgreSQL: what happened (runs, attempts, gaps) and who did what (operator actions).

The read side of the operator's port (HistoryReader), and the two writes that
keep history without silent holes: the gaps a plan drops (written in the
plan's own transaction) and the operator actions. The statements are in
``statements.history``; every answer is a plain dict, never an asyncpg Record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import asyncpg

from actors.adapters.postgres.generations import read_rollout
from actors.adapters.postgres.statements import (
    ACTIONS_PAGE,
    AUDIT_GAPS,
    AUDIT_RUNS,
    DB_NOW,
    GRID_GAPS,
    GRID_PAUSES,
    GRID_RUNS,
    JOB_RECORD,
    JOBS_OVERVIEW,
    LAST_ACTION_ID,
    PAUSES,
    RECORD_ACTION,
    RECORD_GAPS,
    REJECTED_JOBS,
    RELOAD_VERDICT,
    RUN_ATTEMPTS,
    RUN_DETAIL,
    RUNS_PAGE,
)
from actors.domain import RunState
from actors.domain.defaults import OVERDUE_AFTER
from actors.domain.history import Gap, RunRecord
from actors.domain.pause import pause_spans
from actors.ports.messages import ConfigRollout
from actors.ports.operator import (
    Action,
    ActionRecord,
    AttemptRecord,
    Caller,
    JobOverview,
    JobRecord,
    PausedSpan,
    Records,
    RejectedRecord,
    RunDetail,
    RunFilter,
    RunListing,
)


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


class History:
    """The HistoryReader port on PostgreSQL: runs, attempts, gaps, rejected jobs, actions."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def now(self) -> datetime:
        now: datetime = await self._pool.fetchval(DB_NOW)
        return now

    async def jobs(self, name: str | None = None) -> list[JobOverview]:
        return [
            cast(JobOverview, dict(r))
            for r in await self._pool.fetch(JOBS_OVERVIEW, name, OVERDUE_AFTER)
        ]

    async def job(self, name: str) -> JobRecord | None:
        row = await self._pool.fetchrow(JOB_RECORD, name)
        return None if row is None else cast(JobRecord, dict(row))

    async def runs(self, wanted: RunFilter) -> list[RunListing]:
        before = wanted.before
        rows = await self._pool.fetch(
            RUNS_PAGE,
            wanted.job_id,
            list(wanted.states) if wanted.states else None,
            wanted.since,
            wanted.until,
            before[0] if before else None,
            before[1] if before else None,
            wanted.limit,
            wanted.ahead,
        )
        return [cast(RunListing, dict(r)) for r in rows]

    async def run(self, run_id: str) -> tuple[RunDetail, list[AttemptRecord]] | None:
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await conn.fetchrow(RUN_DETAIL, run_id)
            if row is None:
                return None
            attempts = await conn.fetch(RUN_ATTEMPTS, run_id)
        return cast(RunDetail, dict(row)), [cast(AttemptRecord, dict(a)) for a in attempts]

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
        runs = [_run_record(r) for r in rows]
        return runs, [Gap(g["from_at"], g["to_at"], g["count"], g["reason"]) for g in gaps]

    async def paused_spans(self, job: str) -> list[PausedSpan]:
        """From each pause to its resume (None: still paused), as the action log says."""
        return pause_spans([(r["action"], r["at"]) for r in await self._pool.fetch(PAUSES, job)])

    async def grid_records(
        self, ranges: Sequence[tuple[int, datetime]], end: datetime, limit: int
    ) -> dict[int, Records]:
        """GRID_RUNS and GRID_GAPS: two statements over every job's range, one snapshot."""
        out: dict[int, Records] = {job_id: ([], []) for job_id, _ in ranges}
        if not ranges:
            return out
        ids = [job_id for job_id, _ in ranges]
        starts = [start for _, start in ranges]
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            rows = await conn.fetch(GRID_RUNS, ids, starts, end, limit)
            gaps = await conn.fetch(GRID_GAPS, ids, starts, end)
        for r in rows:
            out[r["job_id"]][0].append(_run_record(r))
        for g in gaps:
            out[g["job_id"]][1].append(Gap(g["from_at"], g["to_at"], g["count"], g["reason"]))
        return out

    async def paused_spans_of(self, jobs: Sequence[str]) -> dict[str, list[PausedSpan]]:
        """GRID_PAUSES: every job's pauses and resumes in one statement."""
        actions: dict[str, list[tuple[str, datetime]]] = {}
        for row in await self._pool.fetch(GRID_PAUSES, list(jobs)):
            actions.setdefault(row["job"], []).append((row["action"], row["at"]))
        return {job: pause_spans(found) for job, found in actions.items()}

    async def config_rollout(self, generations: int = 10) -> ConfigRollout:
        """GENERATIONS and CONFIG_REPLICAS (sql/0013)."""
        return await read_rollout(self._pool, generations)

    async def rejected_jobs(self) -> list[RejectedRecord]:
        return [cast(RejectedRecord, dict(r)) for r in await self._pool.fetch(REJECTED_JOBS)]

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
    ) -> list[ActionRecord]:
        return [
            cast(ActionRecord, dict(r))
            for r in await self._pool.fetch(ACTIONS_PAGE, job, before, limit)
        ]


def _run_record(r: asyncpg.Record) -> RunRecord:
    return RunRecord(
        run_id=r["id"],
        scheduled_at=r["scheduled_at"],
        state=RunState(r["state"]),
        trigger=r["trigger"],
        attempt=r["attempt"],
        error=r["error"],
        lease_expires_at=r["lease_expires_at"],
    )


async def record_action(
    conn: asyncpg.Connection | asyncpg.Pool, actor: Caller, action: Action
) -> tuple[int, datetime]:
    """Write one operator action (in the caller's transaction when given a connection)."""
    args = json.dumps(action.arguments or {}, default=str, ensure_ascii=False)
    if len(args) > 4000:  # cut as text, not mid-JSON
        args = json.dumps({"truncated": args[:3900]}, ensure_ascii=False)
    row = await conn.fetchrow(
        RECORD_ACTION,
        _text(actor.name, 200),
        actor.via,
        _text(actor.origin, 200),
        action.name,
        _text(action.job, 200),
        action.run_id,
        _text(args, 8000),
        action.ok,
        _text(action.result, 2000),
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

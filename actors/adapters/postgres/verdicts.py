"""Where an attempt's run goes, applied: completions, the reaper's pass, a stop's hand-back.

The verdicts are actors.domain.decide_attempt's (the worker's for a
completion; decided here, on the rows as locked, for an expired lease and an
interrupted run); the statements apply them and decide nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import asyncpg

from actors.adapters.postgres.errors import rejections
from actors.adapters.postgres.statements import (
    APPLY_INTERRUPTED,
    APPLY_REAPED,
    COMPLETE_RUNS,
    LOCK_EXPIRED_LEASES,
    LOCK_INTERRUPTED,
)
from actors.domain import AttemptVerdict, Outcome, RunState, decide_attempt
from actors.ports import Completion


def _due_s(due_in: timedelta | None) -> float | None:
    return None if due_in is None else due_in.total_seconds()


def _verdict(outcome: Outcome, row: asyncpg.Record) -> AttemptVerdict:
    # No policy: neither verdict waits on a backoff (a lost worker's lease
    # already waited out its length; an interrupted run goes back at once).
    return decide_attempt(
        outcome,
        state=RunState(row["state"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        policy=None,
        run_id=row["id"],
    )


async def complete(pool: asyncpg.Pool, completions: Sequence[Completion]) -> set[tuple[str, int]]:
    """Record each completion's verdict where its epoch still holds (COMPLETE_RUNS)."""
    if not completions:
        return set()
    verdicts = [c.verdict or AttemptVerdict.final(c.result.outcome) for c in completions]
    with rejections():
        rows = await pool.fetch(
            COMPLETE_RUNS,
            [c.run_id for c in completions],
            [c.epoch for c in completions],
            [c.result.outcome.value for c in completions],
            [c.result.exit_code for c in completions],
            [_pg_text(c.result.error) for c in completions],
            [_pg_text(c.result.output_tail) for c in completions],
            [v.state.value for v in verdicts],
            [v.attempt for v in verdicts],
            [_due_s(v.due_in) for v in verdicts],
            [c.worker for c in completions],
        )
    return {(r["run_id"], r["claim_epoch"]) for r in rows}


async def reap(pool: asyncpg.Pool, limit: int) -> list[tuple[str, str, str]]:
    """Runs whose lease expired: each one's verdict decided here, applied in SQL."""
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(LOCK_EXPIRED_LEASES, limit)
        if not rows:
            return []
        verdicts = [_verdict(Outcome.LEASE_EXPIRED, r) for r in rows]
        await conn.execute(
            APPLY_REAPED,
            [r["id"] for r in rows],
            [v.state.value for v in verdicts],
            [v.attempt for v in verdicts],
            [_due_s(v.due_in) for v in verdicts],
            [r["state"] == RunState.RUNNING for r in rows],
            [r["attempt"] for r in rows],
            [r["claim_epoch"] for r in rows],
            [r["lease_owner"] for r in rows],
            [r["started_at"] for r in rows],
        )
    return [
        (r["id"], r["name"], f"{r['state']}->{v.state}")
        for r, v in zip(rows, verdicts, strict=True)
    ]


async def interrupt(pool: asyncpg.Pool, worker: str, runs: Sequence[tuple[str, int]]) -> int:
    """This worker's unfinished runs, handed back as the domain says (a clean stop)."""
    if not runs:
        return 0
    wanted = set(runs)
    async with pool.acquire() as conn, conn.transaction():
        locked = await conn.fetch(LOCK_INTERRUPTED, [r for r, _ in runs])
        rows = [
            r
            for r in locked
            if (r["id"], r["claim_epoch"]) in wanted
            and r["state"] == RunState.RUNNING
            and r["lease_owner"] == worker
        ]
        if not rows:
            return 0
        verdicts = [_verdict(Outcome.INTERRUPTED, r) for r in rows]
        back = await conn.fetch(
            APPLY_INTERRUPTED,
            worker,
            [r["id"] for r in rows],
            [r["claim_epoch"] for r in rows],
            [v.state.value for v in verdicts],
            [
                r["attempt"] if v.attempt is None else v.attempt
                for r, v in zip(rows, verdicts, strict=True)
            ],
            [_due_s(v.due_in) for v in verdicts],
            [r["attempt"] for r in rows],
            [r["started_at"] for r in rows],
        )
    return len(back)


def _pg_text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL, and UTF-8 cannot hold a lone surrogate
    # (a Python exception message may): either would make the database refuse
    # the completion on every retry.
    if value is None:
        return None
    return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")

"""The chaos workload: python jobs whose work is one row in ``chaos_effects``.

The row is the side effect the harness counts. It carries the run's
idempotency key (``ctx.run_id``), the attempt, the fencing token (claim epoch)
and the pid of the process that did the work, so the invariants can tell a
duplicate execution from a lost one and a zombie's late write from the owner's.

These functions run inside the claimd replica processes (``run = { python =
"tests.chaos.workload:record_effect" }``); the harness passes the database in
``CLAIMD_CHAOS_EFFECTS_DSN``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

import asyncpg

from actors.domain import RunContext

EFFECTS_DSN_ENV = "CLAIMD_CHAOS_EFFECTS_DSN"
# The "slow completions" fault: a replica started with this set sleeps that many
# seconds in every execution before doing the work.
SLOW_ENV = "CLAIMD_CHAOS_SLOW_S"
# How long the always-slow job variant works (keeps runs in flight for zombies).
SLOW_JOB_ENV = "CLAIMD_CHAOS_SLOW_JOB_S"
DEFAULT_SLOW_JOB_S = 3.0

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        uuid        NOT NULL,
    job           text        NOT NULL,
    scheduled_at  timestamptz NOT NULL,
    attempt       integer     NOT NULL,
    fencing_token bigint      NOT NULL,
    pid           integer     NOT NULL,
    began_at      timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_effects_run ON chaos_effects (run_id);
CREATE INDEX IF NOT EXISTS chaos_effects_scheduled ON chaos_effects (scheduled_at);
"""

INSERT_EFFECT = """
INSERT INTO chaos_effects (run_id, job, scheduled_at, attempt, fencing_token, pid, began_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""

_pool: asyncpg.Pool | None = None
_pool_lock: asyncio.Lock | None = None


async def _effects_pool() -> asyncpg.Pool:
    """One small pool per replica process, created on first use in its event loop."""
    global _pool, _pool_lock
    if _pool is not None:
        return _pool
    if _pool_lock is None:
        _pool_lock = asyncio.Lock()
    async with _pool_lock:
        if _pool is None:
            _pool = await asyncpg.create_pool(
                os.environ[EFFECTS_DSN_ENV], min_size=1, max_size=4, timeout=5, command_timeout=10
            )
    assert _pool is not None
    return _pool


async def _record(ctx: RunContext, began: datetime) -> None:
    pool = await _effects_pool()
    await pool.execute(
        INSERT_EFFECT,
        ctx.run_id,
        ctx.job,
        ctx.scheduled_at,
        ctx.attempt,
        ctx.fencing_token,
        os.getpid(),
        began,
    )


async def record_effect(ctx: RunContext) -> None:
    """The fast job: record the effect (slowed only on a replica with the slow fault)."""
    began = datetime.now(UTC)
    slow = float(os.environ.get(SLOW_ENV, "0") or 0)
    if slow > 0:
        await asyncio.sleep(slow)
    await _record(ctx, began)


async def record_effect_slow(ctx: RunContext) -> None:
    """The slow job: works a few seconds, then records the effect."""
    began = datetime.now(UTC)
    await asyncio.sleep(float(os.environ.get(SLOW_JOB_ENV, "") or DEFAULT_SLOW_JOB_S))
    slow = float(os.environ.get(SLOW_ENV, "0") or 0)
    if slow > 0:
        await asyncio.sleep(slow)
    await _record(ctx, began)

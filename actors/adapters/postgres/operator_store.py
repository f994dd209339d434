"""The operator's port on PostgreSQL: the history's reads, and each action recorded with it.

An action and its row in ``operator_actions`` commit in one transaction (a
backfill, many short statements, is recorded by the caller when it ends). The
driver's errors leave here as the port's: an outage as StoreUnavailable, a
database without our tables as SchemaMissing, any other refusal as
StoreRefused.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg

from actors.adapters.database import CONNECTION_LOST, DATABASE_ERROR, SCHEMA_MISSING, open_pool
from actors.adapters.postgres.errors import fault_of
from actors.adapters.postgres.history import History, record_action
from actors.adapters.postgres.operations import Operations
from actors.adapters.postgres.statements import ACTIVE_RUN, LOCK_JOB, RUN_JOB, RUN_STATE
from actors.domain import Overlap
from actors.domain.backfill import BackfillProgress
from actors.domain.pause import PausedInstants
from actors.observability import DependencyHealth
from actors.ports.operator import (
    Action,
    ActiveRun,
    Caller,
    Cancelled,
    Recorded,
    Resumed,
    SchemaMissing,
    StoreRefused,
    Unchanged,
)
from actors.ports.translator import Fault, Translator, speaks_the_port, writes


def _operator_fault(exc: BaseException) -> Fault | None:
    # A command's connection that went away under it (the driver's InterfaceError
    # included) is an outage too.
    return fault_of(exc) or (Fault.UNREACHABLE if isinstance(exc, CONNECTION_LOST) else None)


def _operator_error(exc: BaseException) -> BaseException | None:
    if isinstance(exc, SCHEMA_MISSING):
        return SchemaMissing(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, DATABASE_ERROR):
        return StoreRefused(f"{type(exc).__name__}: {exc}")
    return None


# The operator's port: an outage as StoreUnavailable, a database without our tables
# as SchemaMissing, any other refusal as StoreRefused.
OPERATOR = Translator(_operator_fault, _operator_error)


@speaks_the_port(OPERATOR, reads_unless_marked=True)
class PostgresOperatorStore(History):
    """The OperatorStore port on a pool (the replica's, or a command's own).

    ``health``: what its calls report to (the replica's PostgreSQL; None for a
    command's own store). Its methods read, but for the actions marked ``writes``.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        owns_pool: bool = False,
        health: DependencyHealth | None = None,
    ) -> None:
        super().__init__(pool)
        self._owns_pool = owns_pool
        self.health = health

    @classmethod
    async def open(cls, url: str, timeout: float) -> PostgresOperatorStore:
        """A store on a small pool of its own (closed with it), for a short-lived command;
        DatabaseUrlInvalid or DatabaseUnreachable within ``timeout`` seconds."""
        return cls(await open_pool(url, timeout), owns_pool=True)

    async def close(self) -> None:
        if self._owns_pool:
            await self._pool.close()

    @writes
    async def record_action(self, actor: Caller, action: Action) -> Recorded:
        return Recorded(*await record_action(self._pool, actor, action))

    @writes
    async def pause(self, actor: Caller, job: str, *, result: str) -> Recorded | Unchanged:
        async with self._pool.acquire() as conn, conn.transaction():
            if unchanged := await _lock_to_flip(conn, job, paused=True):
                return unchanged
            await Operations(conn).pause(job)
            return Recorded(
                *await record_action(conn, actor, Action("pause", True, result, job=job))
            )

    @writes
    async def resume(
        self,
        actor: Caller,
        job: str,
        paused_instants: PausedInstants,
        *,
        arguments: dict[str, Any],
        result: Callable[[Resumed], str],
    ) -> tuple[Resumed, Recorded] | Unchanged:
        # The job row locked: the skipped runs, the gaps, the mark, the flag and
        # the record change together or not at all.
        async with self._pool.acquire() as conn, conn.transaction():
            if unchanged := await _lock_to_flip(conn, job, paused=False):
                return unchanged
            done = await Operations(conn).resume(job, paused_instants, actor.name)
            recorded = await record_action(
                conn, actor, Action("resume", True, result(done), job=job, arguments=arguments)
            )
            return done, Recorded(*recorded)

    @writes
    async def trigger(
        self,
        actor: Caller,
        job: str,
        at: datetime,
        *,
        arguments: dict[str, Any],
        result: Callable[[str], str],
        overlap: Overlap | None = None,
    ) -> tuple[str, Recorded] | None:
        async with self._pool.acquire() as conn, conn.transaction():
            run_id = await Operations(conn).trigger(job, at, overlap)  # or UnknownJob
            if run_id is None:
                return None
            done = Action("trigger", True, result(run_id), job, run_id, arguments)
            recorded = await record_action(conn, actor, done)
            return run_id, Recorded(*recorded)

    @writes
    async def backfill(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_runs: int,
        progress: Callable[[BackfillProgress], None] | None = None,
        overlap: Overlap | None = None,
    ) -> BackfillProgress:
        return await Operations(self._pool).backfill(  # or UnknownJob, BackfillTooLarge
            job, start, end, max_runs=max_runs, progress=progress, overlap=overlap
        )

    async def active_run(self, job: str) -> ActiveRun | None:
        row = await self._pool.fetchrow(ACTIVE_RUN, job)
        return None if row is None else ActiveRun(row["id"], row["state"])

    @writes
    async def cancel(self, actor: Caller, run_id: str, *, reason: str, result: str) -> Cancelled:
        async with self._pool.acquire() as conn, conn.transaction():
            if await Operations(conn).cancel(run_id, reason):
                job = await conn.fetchval(RUN_JOB, run_id)
                recorded = await record_action(
                    conn, actor, Action("cancel", True, result, job=job, run_id=run_id)
                )
                return Cancelled(Recorded(*recorded), job=job)
            state = await conn.fetchval(RUN_STATE, run_id)
        return Cancelled(None, state=state)


async def _lock_to_flip(conn: asyncpg.Connection, job: str, *, paused: bool) -> Unchanged | None:
    """LOCK_JOB: None when the job exists and its pause flag is not ``paused`` yet (the
    row now locked for the rest of the transaction), else why nothing changes."""
    row = await conn.fetchrow(LOCK_JOB, job)
    if row is None:
        return Unchanged.UNKNOWN_JOB
    return Unchanged.ALREADY if row["paused"] == paused else None

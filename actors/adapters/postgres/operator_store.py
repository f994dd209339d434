"""The operator's port on PostgreSQL: the history's reads, and each action recorded with it.

An action and its row in ``operator_actions`` commit in one transaction (a
backfill, many short statements, is recorded by the caller when it ends). The
driver's errors leave here as the port's: an outage as StoreUnavailable, a
database without our tables as SchemaMissing, any other refusal as
StoreRefused.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import asyncpg

from actors.adapters.database import CONNECTION_LOST, DATABASE_ERROR, SCHEMA_MISSING, open_pool
from actors.adapters.postgres.errors import is_outage
from actors.adapters.postgres.history import History, record_action
from actors.adapters.postgres.operations import Operations
from actors.adapters.postgres.statements import ACTIVE_RUN, LOCK_JOB, RUN_JOB, RUN_STATE
from actors.domain import Overlap
from actors.domain.backfill import BackfillProgress
from actors.domain.pause import PausedInstants
from actors.ports import StoreUnavailable
from actors.ports.operator import (
    ActiveRun,
    Caller,
    Cancelled,
    Recorded,
    Resumed,
    SchemaMissing,
    StoreRefused,
    Unchanged,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _port_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``fn`` raising the port's errors instead of the driver's."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except SCHEMA_MISSING as exc:
            raise SchemaMissing(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if isinstance(exc, CONNECTION_LOST) or is_outage(exc):
                raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
            if isinstance(exc, DATABASE_ERROR):
                raise StoreRefused(f"{type(exc).__name__}: {exc}") from exc
            raise

    return wrapper


def _every_method_speaks_the_port(cls: type[T]) -> type[T]:
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if not name.startswith("_") and inspect.iscoroutinefunction(member):
                setattr(cls, name, _port_errors(member))
    return cls


@_every_method_speaks_the_port
class PostgresOperatorStore(History):
    """The OperatorStore port on a pool (the replica's, or a command's own)."""

    def __init__(self, pool: asyncpg.Pool, *, owns_pool: bool = False) -> None:
        super().__init__(pool)
        self._owns_pool = owns_pool

    @classmethod
    async def open(cls, url: str, timeout: float) -> PostgresOperatorStore:
        """A store on a small pool of its own (closed with it), for a short-lived command;
        DatabaseUrlInvalid or DatabaseUnreachable within ``timeout`` seconds."""
        return cls(await open_pool(url, timeout), owns_pool=True)

    async def close(self) -> None:
        if self._owns_pool:
            await self._pool.close()

    async def record_action(
        self,
        actor: Caller,
        action: str,
        *,
        job: str | None = None,
        run_id: str | None = None,
        arguments: dict[str, Any] | None = None,
        ok: bool,
        result: str,
    ) -> Recorded:
        return Recorded(
            *await record_action(
                self._pool,
                actor,
                action,
                job=job,
                run_id=run_id,
                arguments=arguments,
                ok=ok,
                result=result,
            )
        )

    async def pause(self, actor: Caller, job: str, *, result: str) -> Recorded | Unchanged:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(LOCK_JOB, job)
            if row is None:
                return Unchanged.UNKNOWN_JOB
            if row["paused"]:
                return Unchanged.ALREADY
            await Operations(conn).pause(job)
            return Recorded(
                *await record_action(conn, actor, "pause", job=job, ok=True, result=result)
            )

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
            row = await conn.fetchrow(LOCK_JOB, job)
            if row is None:
                return Unchanged.UNKNOWN_JOB
            if not row["paused"]:
                return Unchanged.ALREADY
            done = await Operations(conn).resume(job, paused_instants, actor.name)
            recorded = await record_action(
                conn, actor, "resume", job=job, arguments=arguments, ok=True, result=result(done)
            )
            return done, Recorded(*recorded)

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
            recorded = await record_action(
                conn,
                actor,
                "trigger",
                job=job,
                run_id=run_id,
                arguments=arguments,
                ok=True,
                result=result(run_id),
            )
            return run_id, Recorded(*recorded)

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

    async def cancel(self, actor: Caller, run_id: str, *, reason: str, result: str) -> Cancelled:
        async with self._pool.acquire() as conn, conn.transaction():
            if await Operations(conn).cancel(run_id, reason):
                job = await conn.fetchval(RUN_JOB, run_id)
                recorded = await record_action(
                    conn, actor, "cancel", job=job, run_id=run_id, ok=True, result=result
                )
                return Cancelled(Recorded(*recorded), job=job)
            state = await conn.fetchval(RUN_STATE, run_id)
        return Cancelled(None, state=state)

"""Job functions (python executor targets) and small helpers for the semantics tests.

The jobs record what really executed, in this process, keyed by the run id
(the idempotency key): the tests judge the scheduler by these records and by
the rows in ``job_runs`` / ``job_run_attempts``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from actors.domain import RunContext


@dataclass(frozen=True)
class Execution:
    """One execution of a job function: which run, and when it began and ended."""

    job: str
    run_id: str
    attempt: int
    started: float  # time.monotonic()
    ended: float


EXECUTIONS: list[Execution] = []
_attempts: dict[str, int] = {}
_lock = threading.Lock()


def executions(job: str) -> list[Execution]:
    return [e for e in EXECUTIONS if e.job == job]


def executed_run_ids(job: str) -> set[str]:
    return {e.run_id for e in executions(job)}


# The recorders are async: they run in this process (on a job event loop),
# where the tests read EXECUTIONS; a sync job would run in a child process.
def _record(ctx: RunContext) -> None:
    now = time.monotonic()
    EXECUTIONS.append(Execution(ctx.job, ctx.run_id, ctx.attempt, now, now))


async def record(ctx: RunContext) -> None:
    """Records that it ran."""
    _record(ctx)


async def slow(ctx: RunContext) -> None:
    """Runs ~2.5 s, longer than its 1 s period, and records its interval."""
    started = time.monotonic()
    await asyncio.sleep(2.5)
    EXECUTIONS.append(Execution(ctx.job, ctx.run_id, ctx.attempt, started, time.monotonic()))


async def fails_twice(ctx: RunContext) -> None:
    """Fails on its first two executions of a run, succeeds on the third."""
    with _lock:
        _attempts[ctx.run_id] = n = _attempts.get(ctx.run_id, 0) + 1
    _record(ctx)
    if n <= 2:
        raise RuntimeError(f"planned failure number {n} of run {ctx.run_id}")


def attempts_of(run_id: str) -> int:
    return _attempts.get(run_id, 0)

"""The python executor: a sync callable(ctx) in a child process, an async one on a job loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from types import ModuleType
from typing import Any

from actors.adapters.executors.children import ForkServer
from actors.adapters.executors.common import (
    KILL_GRACE,
    OUTPUT_TAIL_BYTES,
    Tail,
    elapsed,
)
from actors.adapters.executors.job_loops import JobLoops
from actors.adapters.executors.pool import WarmPool
from actors.domain import (
    ExecutionResult,
    Outcome,
    PythonSpec,
    RunContext,
    defaults,
)


def resolve_callable(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    func = getattr(importlib.import_module(module_name), attr)
    if not callable(func):
        raise TypeError(f"{target} is not callable")
    return func


_RESOLVED: dict[str, tuple[Callable[..., Any], bool, ModuleType, str]] = {}
_RESOLVED_KEPT = 1024


def _resolved(target: str) -> tuple[Callable[..., Any], bool]:
    """The target's callable and whether it is a coroutine function, looked up once.

    Only what resolved is kept: a target that failed to import is tried again
    on its next run (the module may have been installed meanwhile). What is
    kept stands while its module still holds it: a reload that imported the
    module again (a changed ``@claimd.job`` module) gives the new function.
    """
    found = _RESOLVED.get(target)
    if found is None or getattr(found[2], found[3], None) is not found[0]:
        module_name, _, attr = target.partition(":")
        func = resolve_callable(target)
        found = (func, inspect.iscoroutinefunction(func), sys.modules[module_name], attr)
        if len(_RESOLVED) >= _RESOLVED_KEPT:
            _RESOLVED.clear()
        _RESOLVED[target] = found
    return found[0], found[1]


class PythonRunner:
    """Runs python jobs: sync callables in child processes, async ones on job loops.

    A sync callable runs in a warm child process of the pool (``pool``), forked
    from the fork server (``children``) and reused from attempt to attempt:
    killable at its timeout, its death awaited before the verdict. An async one
    runs in this process on a job event loop (``job_loops``), never on the
    worker's. Either way its printed and logged output is kept as the
    attempt's output tail, with claimd's own secrets scrubbed from it.
    """

    def __init__(
        self,
        withheld_env: Iterable[str] = (),
        kill_grace: float = KILL_GRACE,
        processes: int = defaults.PYTHON_PROCESSES,
    ) -> None:
        self.withheld_env = tuple(withheld_env)
        self.kill_grace = kill_grace
        self.children = ForkServer(self.withheld_env)
        self.pool = WarmPool(self.children, processes)
        self.job_loops = JobLoops()

    def warm(self, target: str, count: int = 1) -> None:
        """Runs of ``target`` are coming (held for their instant): a sync one's warm
        children are forked now, not at the instant."""
        with contextlib.suppress(Exception):  # its run reports a target that does not load
            if not _resolved(target)[1]:
                self.pool.warm(target, count)

    async def close(self) -> None:
        """Let the warm children go and end the fork server (a replica's stop)."""
        await self.pool.close()
        await self.children.close()

    async def run(
        self, spec: PythonSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        """Call ``module:function(ctx)``; the attempt ends at the timeout, whatever it does."""
        start = time.monotonic()
        try:
            func, is_async = _resolved(spec.target)
        except Exception as exc:  # noqa: BLE001 - a bad target fails the run, not the worker
            return ExecutionResult(
                Outcome.FAILED, error=f"cannot load {spec.target}: {exc!r}", duration=elapsed(start)
            )
        if is_async:
            result = await self._run_async(func, context, timeout, start)
        else:
            result, output = await self.pool.run(spec.target, context, timeout, self.kill_grace)
            result = dataclasses.replace(result, output_tail=output or None)
        return result  # masked by the executor (every secret the replica knows)

    async def _run_async(
        self,
        func: Callable[[RunContext], Awaitable[Any]],
        context: RunContext,
        timeout: timedelta,
        start: float,
    ) -> ExecutionResult:
        tail = Tail()
        try:
            await self.job_loops.run(
                context.job,
                context.run_id,
                lambda: func(context),
                tail,
                timeout.total_seconds(),
                self.kill_grace,
            )
        except TimeoutError:
            return ExecutionResult(
                Outcome.TIMED_OUT,
                error=f"timed out after {timeout}",
                output_tail=tail.text() or None,
                duration=elapsed(start),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the job's failure, recorded on the run
            tail.add("".join(traceback.format_exception(exc))[-OUTPUT_TAIL_BYTES:].encode())
            return ExecutionResult(
                Outcome.FAILED,
                error=repr(exc)[:1000],
                output_tail=tail.text(),
                duration=elapsed(start),
            )
        return ExecutionResult(
            Outcome.SUCCEEDED, output_tail=tail.text() or None, duration=elapsed(start)
        )


_DEFAULT_RUNNER: PythonRunner | None = None


async def run_python(spec: PythonSpec, context: RunContext, timeout: timedelta) -> ExecutionResult:
    """Run one attempt on this process's default runner (no extra variables withheld)."""
    global _DEFAULT_RUNNER
    if _DEFAULT_RUNNER is None:
        _DEFAULT_RUNNER = PythonRunner()
    return await _DEFAULT_RUNNER.run(spec, context, timeout)

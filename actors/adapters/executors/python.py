"""The python executor: a sync or async callable(ctx), sync ones on daemon threads."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

from actors.adapters.executors.common import OUTPUT_TAIL_BYTES, elapsed
from actors.domain import (
    ExecutionResult,
    Outcome,
    PythonSpec,
    RunContext,
)


class _DaemonThreads:
    """A pool of daemon threads that grows to the peak of concurrent sync jobs.

    Not asyncio.to_thread: the default executor's threads are joined when the
    loop closes, so a sync job that outlived its timeout (Python cannot kill a
    thread) would keep the process from ever exiting after SIGTERM. Threads are
    reused: starting one per run cost a quarter more CPU per run.
    """

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._tasks.put(task)
        if spawn:
            threading.Thread(target=self._serve, name="claimd-sync-job", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._tasks.get()()
            with self._lock:
                self._idle += 1


_SYNC_JOBS = _DaemonThreads()


def _in_daemon_thread(
    func: Callable[[RunContext], Any], context: RunContext
) -> asyncio.Future[Any]:
    """Run a sync job on a daemon thread; the future settles on the event loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return  # abandoned at its timeout
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = func(context), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(settle, result, error)

    _SYNC_JOBS.submit(target)
    return future


def resolve_callable(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    func = getattr(importlib.import_module(module_name), attr)
    if not callable(func):
        raise TypeError(f"{target} is not callable")
    return func


def runs_on_the_loop(target: str) -> bool:
    """Whether ``target`` is a coroutine function (False when it does not resolve)."""
    try:
        return _resolved(target)[1]
    except Exception:  # noqa: BLE001 - its run reports the error; here it only takes a slot
        return False


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


async def run_python(spec: PythonSpec, context: RunContext, timeout: timedelta) -> ExecutionResult:
    """Call ``module:function(ctx)``; async functions are cancelled at the timeout.

    A sync function runs in a thread; at the timeout its result is abandoned
    (Python cannot kill a thread) and the attempt is recorded as timed out.
    The timeout is a deadline on the calling task (``asyncio.timeout``), not
    ``wait_for``: that would run every job in a task of its own, with a timer.
    """
    start = time.monotonic()
    try:
        func, is_async = _resolved(spec.target)
    except Exception as exc:  # noqa: BLE001 - a bad target fails the run, not the worker
        return ExecutionResult(
            Outcome.FAILED, error=f"cannot load {spec.target}: {exc!r}", duration=elapsed(start)
        )
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            if is_async:
                await func(context)
            else:
                await _in_daemon_thread(func, context)
    except TimeoutError:
        return ExecutionResult(
            Outcome.TIMED_OUT, error=f"timed out after {timeout}", duration=elapsed(start)
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the job's failure, recorded on the run
        tb = "".join(traceback.format_exception(exc))[-OUTPUT_TAIL_BYTES:]
        return ExecutionResult(
            Outcome.FAILED, error=repr(exc)[:1000], output_tail=tb, duration=elapsed(start)
        )
    return ExecutionResult(Outcome.SUCCEEDED, duration=elapsed(start))

"""Executors: shell, python and http. Each runs one attempt and reports.

None raises for a failing job.

Errors are caught at the edge of each run, never allowed to reach the loop
that runs the next one. Cancellation (shutdown, a lost lease) is cleaned up
after (the process group killed) and re-raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

import aiohttp

from actors.domain import (
    ExecutionResult,
    ExecutorSpec,
    HttpSpec,
    Outcome,
    PythonSpec,
    RunContext,
    ShellSpec,
)
from actors.observability import get_logger

log = get_logger("executor")
OUTPUT_TAIL_BYTES = 4096
KILL_GRACE = 5.0


def _fill(template: str, values: dict[str, str]) -> str:
    # Only the names claimd defines are replaced; other braces stay as written.
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _elapsed(start: float) -> timedelta:
    return timedelta(seconds=time.monotonic() - start)


class _Tail:
    """The last bytes of a stream, bounded whatever the job prints."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= self._limit and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-self._limit :].decode("utf-8", "replace")


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the whole process group, then SIGKILL after the grace."""
    _kill_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace)
    # Children may outlive the leader: always sweep the group.
    _kill_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


async def _spawn(
    spec: ShellSpec, argv: list[str], env: dict[str, str], output: int
) -> asyncio.subprocess.Process:
    if spec.use_shell:
        return await asyncio.create_subprocess_shell(
            argv[0],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            env=env,
            cwd=spec.cwd,
            start_new_session=True,
        )
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        env=env,
        cwd=spec.cwd,
        start_new_session=True,
    )


async def _pump(read_fd: int, tail: _Tail) -> None:
    """Read the job's output into the tail until every writer has closed the pipe."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
    )
    try:
        while chunk := await reader.read(65536):
            tail.add(chunk)
    finally:
        transport.close()


class MissingSecret(LookupError):
    """A secret the job names is not in claimd's environment."""


def resolve_secrets(mapping: Mapping[str, str]) -> dict[str, str]:
    """Target name -> value, read from this process's environment at run time."""
    missing = [source for source in mapping.values() if source not in os.environ]
    if missing:
        raise MissingSecret(
            f"secret variable(s) not set in claimd's environment: {', '.join(sorted(missing))}"
        )
    return {target: os.environ[source] for target, source in mapping.items()}


def scrub(result: ExecutionResult, secrets: Iterable[str]) -> ExecutionResult:
    """The result with every secret value replaced by *** in what is recorded."""
    values = sorted((v for v in secrets if len(v) >= 4), key=len, reverse=True)
    if not values:
        return result

    def clean(text: str | None) -> str | None:
        if text is None:
            return None
        for value in values:
            text = text.replace(value, "***")
        return text

    return dataclasses.replace(
        result, error=clean(result.error), output_tail=clean(result.output_tail)
    )


async def run_shell(
    spec: ShellSpec, context: RunContext, timeout: timedelta, kill_grace: float = KILL_GRACE
) -> ExecutionResult:
    """Run a program; values of ``secret_env`` never reach the recorded output."""
    try:
        secrets = resolve_secrets(spec.secret_env)
    except MissingSecret as exc:
        return ExecutionResult(Outcome.FAILED, error=str(exc))
    result = await _run_shell(spec, context, timeout, kill_grace, secrets)
    return scrub(result, secrets.values())


async def _run_shell(
    spec: ShellSpec,
    context: RunContext,
    timeout: timedelta,
    kill_grace: float,
    secrets: dict[str, str],
) -> ExecutionResult:
    """Run a program in its own process group; the group dies with the timeout.

    The run ends when the leader exits, not when its output closes: output goes
    to a pipe of our own rather than asyncio's, because asyncio's
    ``Process.wait()`` also waits for its pipes, and a child left in the
    background would hold them open (``daemon & exit 0`` would time out).
    """
    values = context.template_values()
    argv = [_fill(a, values) for a in spec.argv]
    env = {**os.environ, **spec.env, **secrets, **context.env()}
    start = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        proc = await _spawn(spec, argv, env, write_fd)
    except OSError as exc:
        os.close(read_fd)
        return ExecutionResult(
            Outcome.FAILED, error=f"cannot start {argv[0]!r}: {exc}", duration=_elapsed(start)
        )
    finally:
        os.close(write_fd)  # the child holds its own copy
    tail = _Tail()
    pumping = asyncio.ensure_future(_pump(read_fd, tail))
    try:
        await asyncio.wait_for(proc.wait(), timeout.total_seconds())
    except TimeoutError:
        await _terminate(proc, kill_grace)
        await _drain(pumping)
        return ExecutionResult(
            Outcome.TIMED_OUT,
            exit_code=proc.returncode,
            error=f"timed out after {timeout}; process group killed",
            output_tail=tail.text(),
            duration=_elapsed(start),
        )
    except asyncio.CancelledError:
        await asyncio.shield(_terminate(proc, kill_grace))
        pumping.cancel()
        raise
    # The leader exited; make sure nothing it left behind in its group lingers.
    _kill_group(proc.pid, signal.SIGKILL)
    await _drain(pumping)
    code = proc.returncode
    if code == 0:
        return ExecutionResult(
            Outcome.SUCCEEDED, exit_code=0, output_tail=tail.text(), duration=_elapsed(start)
        )
    return ExecutionResult(
        Outcome.FAILED,
        exit_code=code,
        error=f"exit status {code}",
        output_tail=tail.text(),
        duration=_elapsed(start),
    )


async def _drain(pumping: asyncio.Future[None], limit: float = 2.0) -> None:
    """Let the pump read what is left; a process outside the group may hold the pipe."""
    try:
        await asyncio.wait_for(pumping, limit)
    except TimeoutError:
        pass
    except Exception as exc:  # noqa: BLE001 - losing the tail must not lose the verdict
        log.warning("output capture failed; the verdict stands without it", error=repr(exc))


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


_RESOLVED: dict[str, tuple[Callable[..., Any], bool]] = {}
_RESOLVED_KEPT = 1024


def _resolved(target: str) -> tuple[Callable[..., Any], bool]:
    """The target's callable and whether it is a coroutine function, looked up once.

    Only what resolved is kept: a target that failed to import is tried again
    on its next run (the module may have been installed meanwhile).
    """
    found = _RESOLVED.get(target)
    if found is None:
        func = resolve_callable(target)
        found = (func, inspect.iscoroutinefunction(func))
        if len(_RESOLVED) >= _RESOLVED_KEPT:
            _RESOLVED.clear()
        _RESOLVED[target] = found
    return found


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
            Outcome.FAILED, error=f"cannot load {spec.target}: {exc!r}", duration=_elapsed(start)
        )
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            if is_async:
                await func(context)
            else:
                await _in_daemon_thread(func, context)
    except TimeoutError:
        return ExecutionResult(
            Outcome.TIMED_OUT, error=f"timed out after {timeout}", duration=_elapsed(start)
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the job's failure, recorded on the run
        tb = "".join(traceback.format_exception(exc))[-OUTPUT_TAIL_BYTES:]
        return ExecutionResult(
            Outcome.FAILED, error=repr(exc)[:1000], output_tail=tb, duration=_elapsed(start)
        )
    return ExecutionResult(Outcome.SUCCEEDED, duration=_elapsed(start))


async def run_http(spec: HttpSpec, context: RunContext, timeout: timedelta) -> ExecutionResult:
    """Send the request with the run's identity as headers (``Idempotency-Key``)."""
    try:
        secrets = resolve_secrets(spec.secret_headers)
    except MissingSecret as exc:
        return ExecutionResult(Outcome.FAILED, error=str(exc))
    return scrub(await _run_http(spec, context, timeout, secrets), secrets.values())


async def _run_http(
    spec: HttpSpec, context: RunContext, timeout: timedelta, secrets: dict[str, str]
) -> ExecutionResult:
    start = time.monotonic()
    values = context.template_values()
    headers = {**spec.headers, **secrets, **context.headers()}
    body = None if spec.body is None else _fill(spec.body, values)
    try:
        async with (
            aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout.total_seconds())
            ) as session,
            session.request(
                spec.method, _fill(spec.url, values), headers=headers, data=body
            ) as response,
        ):
            text = (await response.text(errors="replace"))[-OUTPUT_TAIL_BYTES:]
            if response.status in spec.expect_status:
                return ExecutionResult(
                    Outcome.SUCCEEDED,
                    exit_code=response.status,
                    output_tail=text,
                    duration=_elapsed(start),
                )
            return ExecutionResult(
                Outcome.FAILED,
                exit_code=response.status,
                error=f"HTTP {response.status}",
                output_tail=text,
                duration=_elapsed(start),
            )
    except TimeoutError:
        return ExecutionResult(
            Outcome.TIMED_OUT, error=f"timed out after {timeout}", duration=_elapsed(start)
        )
    except aiohttp.ClientError as exc:
        return ExecutionResult(
            Outcome.FAILED, error=f"request failed: {exc!r}"[:1000], duration=_elapsed(start)
        )


class LocalExecutor:
    """Executor port: dispatches on the spec's kind."""

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        if isinstance(spec, ShellSpec):
            return await run_shell(spec, context, timeout)
        if isinstance(spec, PythonSpec):
            return await run_python(spec, context, timeout)
        return await run_http(spec, context, timeout)

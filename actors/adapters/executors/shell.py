"""The shell executor: a process tree with the run in its environment, killed on timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from datetime import timedelta

from actors.adapters.executors.common import (
    KILL_GRACE,
    MissingSecret,
    Tail,
    drain_output,
    elapsed,
    fill,
    job_environment,
    pump_output,
    resolve_secrets,
    scrub,
)
from actors.adapters.executors.process_tree import (
    MARKER,
    kill_tree,
    new_marker,
    signal_tree,
)
from actors.adapters.executors.spawn import Process, spawn
from actors.domain import (
    ExecutionResult,
    Outcome,
    RunContext,
    ShellSpec,
)
from actors.observability import get_logger

log = get_logger("executor")


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _leader(proc: Process) -> int | None:
    # Once reaped, the leader's pid may be another process's.
    return proc.pid if proc.returncode is None else None


async def _terminate(proc: Process, grace: float, marker: str) -> None:
    """SIGTERM the whole process tree, then SIGKILL after the grace.

    The tree is more than the group: a ``setsid`` child left it
    (actors.adapters.executors.process_tree finds it by its marker).
    """
    _kill_group(proc.pid, signal.SIGTERM)
    await asyncio.to_thread(signal_tree, _leader(proc), marker, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace)
    # Children may outlive the leader: always sweep the group, then the tree.
    _kill_group(proc.pid, signal.SIGKILL)
    killed = await asyncio.to_thread(kill_tree, _leader(proc), marker)
    if killed:
        log.info("process tree killed", processes=killed)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


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
    argv = [fill(a, values) for a in spec.argv]
    marker = new_marker()
    env = {**job_environment(spec, context, secrets), MARKER: marker}
    start = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        proc = await spawn(argv, use_shell=spec.use_shell, env=env, cwd=spec.cwd, output=write_fd)
    except OSError as exc:
        os.close(read_fd)
        return ExecutionResult(
            Outcome.FAILED, error=f"cannot start {argv[0]!r}: {exc}", duration=elapsed(start)
        )
    finally:
        os.close(write_fd)  # the child holds its own copy
    tail = Tail()
    pumping = asyncio.ensure_future(pump_output(read_fd, tail))
    try:
        await asyncio.wait_for(proc.wait(), timeout.total_seconds())
    except TimeoutError:
        await _terminate(proc, kill_grace, marker)
        await drain_output(pumping)
        return ExecutionResult(
            Outcome.TIMED_OUT,
            exit_code=proc.returncode,
            error=f"timed out after {timeout}; process tree killed",
            output_tail=tail.text(),
            duration=elapsed(start),
        )
    except asyncio.CancelledError:
        await asyncio.shield(_terminate(proc, kill_grace, marker))
        pumping.cancel()
        raise
    # The leader exited; make sure nothing it left behind in its group lingers.
    _kill_group(proc.pid, signal.SIGKILL)
    await drain_output(pumping)
    code = proc.returncode
    if code == 0:
        return ExecutionResult(
            Outcome.SUCCEEDED, exit_code=0, output_tail=tail.text(), duration=elapsed(start)
        )
    return ExecutionResult(
        Outcome.FAILED,
        exit_code=code,
        error=f"exit status {code}",
        output_tail=tail.text(),
        duration=elapsed(start),
    )

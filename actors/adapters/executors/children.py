"""The worker's side of the fork server: sync python jobs in killable child processes.

One fork server per worker process (``zygote.py``), started at the first sync
python run with the job environment. A run is one child forked from it; at
the timeout (or a cancellation) its process group is signalled and its death
awaited before the attempt's verdict is handed on, so a retry never overlaps
the attempt before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from actors.adapters.executors.common import (
    KILL_GRACE,
    OUTPUT_TAIL_BYTES,
    Tail,
    drain_output,
    elapsed,
    pump_output,
    python_environment,
)
from actors.domain import ExecutionResult, Outcome, RunContext
from actors.observability import PYTHON_CHILDREN_STARTED, get_logger

log = get_logger("executor")

MESSAGE_LIMIT = 1 << 20
# A cold fork server (an interpreter, claimd's domain, the job's module) may take
# this long on a loaded host before it forks the first child; not the job's time.
SERVER_START_S = 30.0


class ForkServerLost(RuntimeError):
    """The fork server ended; its children were killed with it."""


@dataclass
class _Child:
    pid: asyncio.Future[int]
    exited: asyncio.Future[int]  # the wait status, once the server reaped it
    started: float = field(default_factory=time.monotonic)


class ForkServer:
    """A client of one fork server process; restarted at the next run if it died."""

    def __init__(self, withheld_env: Iterable[str] = ()) -> None:
        self.withheld_env = tuple(withheld_env)
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._children: dict[str, _Child] = {}
        self._starting: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sending: asyncio.Lock | None = None
        self._serial = 0

    async def _ensure(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A new event loop (a test's, or a restarted process's): the old
            # server's pipes belong to the old loop; it ends when its socket closes.
            if self._sock is not None:
                self._sock.close()
            self._sock, self._proc, self._reader, self._children = None, None, None, {}
            self._starting, self._loop = asyncio.Lock(), loop
            self._sending = asyncio.Lock()
        assert self._starting is not None
        async with self._starting:
            if self._sock is not None:
                return self._sock
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "actors.adapters.executors.zygote",
                    str(theirs.fileno()),
                    pickle.dumps(list(sys.path)).hex(),
                    stdin=asyncio.subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=python_environment(self.withheld_env),
                    # Its own group: a Ctrl-C at the terminal is claimd's to handle.
                    start_new_session=True,
                )
            finally:
                theirs.close()
            mine.setblocking(False)
            self._sock = mine
            self._reader = asyncio.ensure_future(self._read(mine))
            log.info("python fork server started", pid=self._proc.pid)
            return mine

    async def _read(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(sock, MESSAGE_LIMIT):
                kind, key, value = pickle.loads(data)
                child = self._children.get(key)
                if child is None:
                    continue
                if kind == "failed":
                    for future in (child.pid, child.exited):
                        if not future.done():
                            future.set_exception(ForkServerLost(value))
                            future.exception()  # retrieved: the waiter may have gone
                    continue
                target = child.pid if kind == "pid" else child.exited
                if not target.done():
                    target.set_result(value)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._lost(sock)

    def _lost(self, sock: socket.socket) -> None:
        """The server is gone (it kills its children as it goes): fail what waited on it."""
        if self._sock is not sock:
            sock.close()
            return  # an old server's (replaced on purpose)
        log.warning("python fork server ended; the next sync python run starts another")
        self._abandon(self._proc)

    def _abandon(self, proc: asyncio.subprocess.Process | None) -> None:
        """Forget the server: its children are killed, what waited on them fails."""
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        for child in self._children.values():
            # A server killed outright leaves its children running: end them from here.
            if child.pid.done() and not child.pid.cancelled() and child.pid.exception() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid.result(), signal.SIGKILL)
            for future in (child.pid, child.exited):
                if not future.done():
                    future.set_exception(ForkServerLost("the python fork server ended"))
                    future.exception()  # retrieved: not every waiter is still there
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def _send(self, sock: socket.socket, message: tuple[Any, ...], fds: list[int]) -> None:
        """One request. Senders take turns: when the socket's buffer is full (a herd of
        runs at one instant), one of them waits for it to drain; a second add_writer on
        the descriptor would replace the first waiter's callback and strand it."""
        data = pickle.dumps(message)
        loop = asyncio.get_running_loop()
        assert self._sending is not None
        async with self._sending:
            while True:
                try:
                    socket.send_fds(sock, [data], fds)
                    return
                except BlockingIOError:
                    pass
                except OSError as exc:  # closed: the server died (or was replaced)
                    raise ForkServerLost(f"the python fork server ended: {exc}") from None
                writable = loop.create_future()
                loop.add_writer(sock.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(sock.fileno())

    async def run(
        self,
        target: str,
        context: RunContext,
        timeout: timedelta,
        kill_grace: float = KILL_GRACE,
    ) -> tuple[ExecutionResult, str]:
        """Run ``target(context)`` in a child; its result and output tail (unscrubbed)."""
        start = time.monotonic()
        sock = await self._ensure()
        self._serial += 1
        key = f"{context.run_id}#{context.fencing_token}#{self._serial}"
        loop = asyncio.get_running_loop()
        child = _Child(loop.create_future(), loop.create_future())
        self._children[key] = child
        out_r, out_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        env = {**python_environment(self.withheld_env), **context.env()}
        tail = Tail()
        pumping: asyncio.Future[None] | None = None
        try:
            pumping = asyncio.ensure_future(pump_output(out_r, tail))
            out_r = -1  # the pump owns it now
            # The timeout is the job's: it starts at the fork, not while a cold
            # server starts, a herd's requests queue or the job's module is
            # imported. That phase has a bound of its own (the timeout, plus a
            # cold server's start): a module whose import hangs would hold the
            # server, which is then replaced (killing what it started).
            try:
                async with asyncio.timeout(timeout.total_seconds() + SERVER_START_S):
                    try:
                        await self._send(
                            sock, ("run", key, target, context, env, None), [out_w, verdict_w]
                        )
                    finally:
                        os.close(out_w)  # the child holds its own copies
                        os.close(verdict_w)
                    PYTHON_CHILDREN_STARTED.inc()
                    await asyncio.shield(child.pid)
            except asyncio.CancelledError:
                # The request may be out: its child must not run on unwatched.
                await asyncio.shield(self._end(sock, key, child, kill_grace))
                raise
            except TimeoutError:
                self._replace("it did not start a job within the job's timeout")
                return (
                    ExecutionResult(
                        Outcome.TIMED_OUT,
                        error=f"timed out after {timeout} before the job's process started "
                        "(its module's import?); the python fork server was replaced",
                        duration=elapsed(start),
                    ),
                    tail.text(),
                )
            try:
                async with asyncio.timeout(timeout.total_seconds()):
                    status = await asyncio.shield(child.exited)
            except TimeoutError:
                await self._end(sock, key, child, kill_grace)
                await drain_output(pumping)
                return (
                    ExecutionResult(
                        Outcome.TIMED_OUT,
                        error=f"timed out after {timeout}; the job's process group was killed",
                        duration=elapsed(start),
                    ),
                    tail.text(),
                )
            except asyncio.CancelledError:
                await asyncio.shield(self._end(sock, key, child, kill_grace))
                raise
            await drain_output(pumping)
            return _verdict(verdict_r, status, start), tail.text()
        except ForkServerLost as exc:
            return (
                ExecutionResult(Outcome.FAILED, error=str(exc), duration=elapsed(start)),
                tail.text(),
            )
        finally:
            self._children.pop(key, None)
            if out_r >= 0:
                os.close(out_r)
            os.close(verdict_r)
            if pumping is not None and not pumping.done():
                pumping.cancel()

    async def _end(self, sock: socket.socket, key: str, child: _Child, grace: float) -> None:
        """SIGTERM the child's group, SIGKILL after the grace, and wait until it is reaped.

        The verdict waits for the death: the attempt after this one must not
        start while this one still runs.
        """
        try:
            # The server answers a run with its pid before anything else.
            await asyncio.wait_for(asyncio.shield(child.pid), SERVER_START_S)
        except ForkServerLost:
            return
        except TimeoutError:
            self._replace("it did not answer a run it was sent")
            return
        if child.exited.done():
            return
        with contextlib.suppress(OSError):
            await self._send(sock, ("kill", key, signal.SIGTERM), [])
        try:
            await asyncio.wait_for(asyncio.shield(child.exited), grace)
            return
        except (TimeoutError, ForkServerLost):
            pass
        if child.exited.done():
            return
        with contextlib.suppress(OSError):
            await self._send(sock, ("kill", key, signal.SIGKILL), [])
        with contextlib.suppress(ForkServerLost):
            await asyncio.shield(child.exited)

    def _replace(self, why: str) -> None:
        """End a server that stopped answering (SIGTERM: it kills its children's groups)."""
        log.warning("replacing the python fork server", reason=why)
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # its SIGTERM handler kills its children's groups
        self._abandon(None)  # the next run starts another server at once

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                if proc is not None:
                    proc.kill()

        asyncio.get_running_loop().call_later(KILL_GRACE, kill)

    async def close(self) -> None:
        """End the server (it kills the children it still has)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._reader is not None:
            self._reader.cancel()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()


def _verdict(verdict_fd: int, status: int, start: float) -> ExecutionResult:
    """What the child wrote to its verdict pipe; if nothing, how it died."""
    os.set_blocking(verdict_fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(verdict_fd, 65536):
            data += chunk
    code = os.waitstatus_to_exitcode(status)
    verdict: dict[str, Any] | None = None
    with contextlib.suppress(Exception):
        verdict = pickle.loads(data) if data else None
    if verdict is None:
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return ExecutionResult(
            Outcome.FAILED,
            exit_code=code,
            error=f"the job's process ended without a verdict ({how})",
            duration=elapsed(start),
        )
    if verdict.get("outcome") == "succeeded":
        return ExecutionResult(Outcome.SUCCEEDED, duration=elapsed(start))
    return ExecutionResult(
        Outcome.FAILED,
        error=str(verdict.get("error", "failed"))[:1000],
        duration=elapsed(start),
    )


__all__ = ["OUTPUT_TAIL_BYTES", "ForkServer", "ForkServerLost"]

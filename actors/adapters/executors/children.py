"""The worker's side of the fork server: it starts, signals and reaps the warm children.

One fork server per worker process (``zygote.py``), started at the first sync
python run with the job environment. It forks the warm children the pool
(``pool.py``) asks for, each in a process group of its own, and reports when
each is reaped (its group swept with SIGKILL). An attempt past its timeout (or
cancelled) is ended here: its child's group is signalled, and its death
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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from actors.adapters.executors.child_output import ChildOutput
from actors.adapters.executors.common import KILL_GRACE, OUTPUT_TAIL_BYTES, python_environment
from actors.observability import PYTHON_CHILDREN_STARTED, get_logger

log = get_logger("executor")

MESSAGE_LIMIT = 1 << 20
# A cold fork server (an interpreter, claimd's domain, the job's module) may take
# this long on a loaded host before it forks the first child; not the job's time.
SERVER_START_S = 30.0


class ForkServerLost(RuntimeError):
    """The fork server ended; its children were killed with it."""


@dataclass
class WarmChild:
    """A warm child as the worker sees it: its socket, its pid, its end."""

    key: str
    sock: socket.socket  # the worker's end: attempts out, verdicts in
    pid: asyncio.Future[int]
    exited: asyncio.Future[int]  # the wait status, once the server reaped it
    attempts: int = 0
    env: int = 0  # the version of the base environment it was last sent
    output: ChildOutput | None = None  # its output pipe's reader, from its first attempt

    def close(self) -> None:
        """Let the child go: an idle child reads the end of its socket and exits."""
        self.sock.close()


class ForkServer:
    """A client of one fork server process; restarted at the next run if it died."""

    def __init__(self, withheld_env: Iterable[str] = ()) -> None:
        self.withheld_env = tuple(withheld_env)
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._children: dict[str, WarmChild] = {}
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
                    self._children.pop(key, None)
                    continue
                target = child.pid if kind == "pid" else child.exited
                if not target.done():
                    target.set_result(value)
                if kind == "exit":
                    self._children.pop(key, None)
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
        self._children = {}
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

    async def spawn(self, target: str | None) -> WarmChild:
        """Fork a warm child (``target``'s module imported first, when given) and return it
        once the server has answered with its pid."""
        sock = await self._ensure()
        self._serial += 1
        key = f"w{self._serial}"
        loop = asyncio.get_running_loop()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        child = WarmChild(key, mine, loop.create_future(), loop.create_future())
        self._children[key] = child
        try:
            try:
                await self._send(sock, ("spawn", key, target), [theirs.fileno()])
            finally:
                theirs.close()  # the child holds its own copy
            PYTHON_CHILDREN_STARTED.inc()
            await asyncio.shield(child.pid)
        except BaseException:
            mine.close()
            if child.pid.done() and not child.exited.done():
                # Spawned after all: it ends when its socket closes; ended here at once.
                await asyncio.shield(self.end(child, 0.0))
            raise
        return child

    async def end(self, child: WarmChild, grace: float) -> None:
        """SIGTERM the child's group, SIGKILL after the grace, and wait until it is reaped.

        The verdict waits for the death: the attempt after this one must not
        start while this one still runs.
        """
        child.close()
        try:
            # The server answers a spawn with its pid before anything else.
            await asyncio.wait_for(asyncio.shield(child.pid), SERVER_START_S)
        except ForkServerLost:
            return
        except TimeoutError:
            self._replace("it did not answer a spawn it was sent")
            return
        sock = self._sock
        if child.exited.done() or sock is None:
            return
        with contextlib.suppress(OSError, ForkServerLost):
            await self._send(sock, ("kill", child.key, signal.SIGTERM), [])
        try:
            await asyncio.wait_for(asyncio.shield(child.exited), grace)
            return
        except (TimeoutError, ForkServerLost):
            pass
        if child.exited.done():
            return
        with contextlib.suppress(OSError, ForkServerLost):
            await self._send(sock, ("kill", child.key, signal.SIGKILL), [])
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


__all__ = ["OUTPUT_TAIL_BYTES", "ForkServer", "ForkServerLost", "WarmChild"]

"""Sync python attempts on warm, reusable child processes (the pool), killable at their timeout.

A fork per attempt cost about 6 ms of CPU (the fork, the child's copy-on-write
faults, its exit): a herd of 1,000 sync runs at one instant began over
seconds. The pool keeps up to ``size`` warm children (forked from the fork
server, ``children.py``) and gives each attempt an idle one: sending it the
attempt is one message (the first also passes the child its output pipe,
``child_output.py``). A child is ended only when

- its attempt passes the timeout, or is cancelled (a shutdown, a lost lease):
  its whole process group is killed and its death awaited before the verdict
  is handed on, so the retry never runs beside it;
- it dies (``os._exit``, a signal): the attempt fails with how it ended;
- its attempt left a thread or a process running: the child exits, the fork
  server sweeps its group, and the verdict waits for that.

and the next attempt that finds no idle child forks a new one. A child's
output pipe is read for its life; each attempt's tail is cut from it at the
marker the child writes after an attempt it is reused after, and the verdict
is handed on only once both the answer and that marker came: what one attempt
prints is never another's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import time
from datetime import timedelta
from typing import Any

from actors.adapters.executors.child_output import DRAIN_S, ChildOutput
from actors.adapters.executors.children import (
    SERVER_START_S,
    ForkServer,
    ForkServerLost,
    WarmChild,
)
from actors.adapters.executors.common import (
    KILL_GRACE,
    Tail,
    elapsed,
    python_environment,
)
from actors.domain import ExecutionResult, Outcome, RunContext, defaults
from actors.observability import get_logger
from actors.observability.secrets import MASKER

log = get_logger("executor")
ANSWER_LIMIT = 1 << 16
# Attempts a warm child serves before it is let go (and a new one forked when needed):
# glibc keeps every value given to setenv, so each attempt's own CLAIMD_RUN_ID and
# CLAIMD_SCHEDULED_AT grow a child by about 134 bytes for good (measured); this bounds
# that to about 1.3 MB a child, for one fork per 10,000 attempts.
RETIRE_AFTER = 10_000


class WarmPool:
    """Up to ``size`` warm children; an attempt takes an idle one, or waits for one."""

    def __init__(self, server: ForkServer, size: int = defaults.PYTHON_PROCESSES) -> None:
        self.server = server
        self.size = max(1, size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[WarmChild] = []
        self._live = 0  # children idle, busy or being forked
        self._free = asyncio.Semaphore(self.size)  # attempts in children at once
        self._arrived: asyncio.Event | None = None
        self._warming: set[asyncio.Task[None]] = set()
        # What every attempt starts from (claimd's environment, its settings and
        # secrets left out), computed again when the environment or the secrets the
        # replica knows change; a child is sent it when its version is new to it.
        self._env_key: tuple[int, int] | None = None
        self._env: dict[str, str] = {}
        self._env_version = 0

    def _base_env(self) -> tuple[int, dict[str, str]]:
        key = (len(os.environ), len(MASKER))
        if key != self._env_key:
            self._env = python_environment(self.server.withheld_env)
            self._env_key = key
            self._env_version += 1
        return self._env_version, self._env

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A new event loop (a test's, a restarted process's): the old children's
            # sockets belong to the old one; they exit when their sockets close.
            for child in self._idle:
                _let_go(child)
            self._idle, self._live, self._loop = [], 0, loop
            self._free = asyncio.Semaphore(self.size)
            self._arrived = asyncio.Event()
            self._warming = set()
        return loop

    @property
    def idle(self) -> int:
        return len(self._idle)

    def warm(self, target: str, count: int = 1) -> None:
        """Runs of ``target`` are coming: fork up to ``count`` more children ahead of them
        (within ``size``), with its module imported by the fork server first."""
        try:
            self._bind()
        except RuntimeError:  # no running loop: nothing to warm on
            return
        for _ in range(min(count, self.size - self._live)):
            self._live += 1
            task = asyncio.ensure_future(self._warm_one(target))
            self._warming.add(task)
            task.add_done_callback(self._warming.discard)

    async def _warm_one(self, target: str) -> None:
        try:
            child = await asyncio.wait_for(self.server.spawn(target), SERVER_START_S)
        except Exception as exc:  # noqa: BLE001 - a run forks its own child then
            self._live -= 1
            log.warning("warming a python child failed", error=repr(exc))
            return
        self._give_back(child)

    def _give_back(self, child: WarmChild) -> None:
        self._idle.append(child)
        assert self._arrived is not None
        self._arrived.set()

    def _drop(self, child: WarmChild) -> None:
        """The child will serve no more attempts (it is ending, or ended)."""
        _let_go(child)
        self._live -= 1
        assert self._arrived is not None
        self._arrived.set()  # a waiter may fork one in its place

    def _idle_one(self) -> WarmChild | None:
        while self._idle:
            child = self._idle.pop()
            if not child.exited.done():
                return child
            self._drop(child)  # died idle (or its server did)
        return None

    async def _take(self, target: str) -> WarmChild:
        """An idle live child, or a new one (within ``size``), or the next one given back."""
        assert self._arrived is not None
        while True:
            if (child := self._idle_one()) is not None:
                return child
            if self._live < self.size:
                self._live += 1
                try:
                    return await self.server.spawn(target)
                except BaseException:
                    self._live -= 1
                    raise
            self._arrived.clear()
            await self._arrived.wait()

    async def run(
        self, target: str, context: RunContext, timeout: timedelta, kill_grace: float = KILL_GRACE
    ) -> tuple[ExecutionResult, str]:
        """Run ``target(context)`` in a warm child; its result and output tail (unscrubbed).

        The timeout is the job's: it starts when the child is handed the
        attempt, not while a herd's attempts wait for a child. Forking a child
        has a bound of its own (the timeout, plus a cold server's start): a
        module whose import hangs holds the server, which is then replaced.
        """
        start = time.monotonic()
        self._bind()
        async with self._free:
            # Most often a child is idle: taken without arming the fork's timer.
            child = self._idle_one()
            try:
                if child is None:
                    async with asyncio.timeout(timeout.total_seconds() + SERVER_START_S):
                        child = await self._take(target)
            except TimeoutError:
                self.server._replace("it did not start a job within the job's timeout")
                error = (
                    f"timed out after {timeout} before the job's process started "
                    "(its module's import?); the python fork server was replaced"
                )
                return ExecutionResult(Outcome.TIMED_OUT, error=error, duration=elapsed(start)), ""
            except ForkServerLost as exc:
                return ExecutionResult(Outcome.FAILED, error=str(exc), duration=elapsed(start)), ""
            return await self._attempt(child, target, context, timeout, kill_grace, start)

    async def _attempt(
        self,
        child: WarmChild,
        target: str,
        context: RunContext,
        timeout: timedelta,
        kill_grace: float,
        start: float,
    ) -> tuple[ExecutionResult, str]:
        loop = asyncio.get_running_loop()
        version, base = self._base_env()
        output = child.output
        first = output is None
        if output is None:
            output = child.output = ChildOutput(loop)
        request = (
            target,
            context,
            version,
            None if child.env == version else base,
            None,
            output.marker if first else None,
        )
        tail = Tail()  # made here: it takes this execution's live-output sink
        ended = output.begin(tail)
        keep = False
        try:
            try:
                if first:
                    # Once per child: its output pipe, kept for its life.
                    socket.send_fds(child.sock, [pickle.dumps(request)], [output.write_fd])
                else:
                    child.sock.send(pickle.dumps(request))
                child.attempts += 1
                child.env = version
            except OSError:
                pass  # the child is gone: its end of the socket reads as closed below
            finally:
                output.handed()
            try:
                async with asyncio.timeout(timeout.total_seconds()):
                    data = await loop.sock_recv(child.sock, ANSWER_LIMIT)
            except (TimeoutError, asyncio.CancelledError) as exc:
                await asyncio.shield(self.server.end(child, kill_grace))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                await output.finish()
                error = f"timed out after {timeout}; the job's process group was killed"
                return ExecutionResult(
                    Outcome.TIMED_OUT, error=error, duration=elapsed(start)
                ), tail.text()
            except OSError:
                data = b""
            answer = _answer(data)
            if answer is not None and answer[1]:
                # Its output is whole at the marker, written before the answer was sent.
                # Given back only once the marker was read (a stale one would cut the
                # next attempt's output), so not when cancelled while waiting for it.
                keep = await _marked(ended)
                if not keep:
                    log.warning("a python child answered without its output's end; ended")
                    await asyncio.shield(self.server.end(child, 0.0))
                    await output.finish()
            else:
                # Dead, or leaving: its group is swept (what the attempt left with it)
                # before the verdict goes on; its output ends with the last writer.
                child.close()
                status = await asyncio.shield(child.exited)
                await output.finish()
            if answer is None:
                return _died(status, start), tail.text()
            return _verdict(answer[0], start), tail.text()
        except ForkServerLost as exc:
            return ExecutionResult(
                Outcome.FAILED, error=str(exc), duration=elapsed(start)
            ), tail.text()
        finally:
            output.stop()
            if keep and child.attempts < RETIRE_AFTER:
                self._give_back(child)
            else:
                self._drop(child)

    async def close(self) -> None:
        """Let every idle child go (they exit when their sockets close)."""
        for task in list(self._warming):
            task.cancel()
        for child in self._idle:
            _let_go(child)
        self._live -= len(self._idle)
        self._idle = []


def _let_go(child: WarmChild) -> None:
    """Its socket closed (an idle child exits at that) and its output no longer read."""
    child.close()
    if child.output is not None:
        child.output.close()


async def _marked(ended: asyncio.Future[bool]) -> bool:
    """Whether the child's marker was read: at once, but for a loop busy elsewhere."""
    if not ended.done():  # most often it is: read before the answer
        try:
            await asyncio.wait_for(asyncio.shield(ended), DRAIN_S)
        except TimeoutError:
            return False
    return ended.result()


def _answer(data: bytes) -> tuple[dict[str, Any], bool] | None:
    """The child's ``("done", verdict, reusable)``, or None when it ended without one."""
    with contextlib.suppress(Exception):
        kind, verdict, reusable = pickle.loads(data)
        if kind == "done" and isinstance(verdict, dict):
            return verdict, bool(reusable)
    return None


def _died(status: int, start: float) -> ExecutionResult:
    code = os.waitstatus_to_exitcode(status)
    how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    return ExecutionResult(
        Outcome.FAILED,
        exit_code=code,
        error=f"the job's process ended without a verdict ({how})",
        duration=elapsed(start),
    )


def _verdict(verdict: dict[str, Any], start: float) -> ExecutionResult:
    if verdict.get("outcome") == "succeeded":
        return ExecutionResult(Outcome.SUCCEEDED, duration=elapsed(start))
    return ExecutionResult(
        Outcome.FAILED,
        error=str(verdict.get("error", "failed"))[:1000],
        duration=elapsed(start),
    )

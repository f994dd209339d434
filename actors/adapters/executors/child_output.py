"""A warm child's output: one pipe for its life, read by one reader, cut into attempts.

An output pipe and a read transport per attempt, and the pipe's descriptor
passed with every request (``send_fds``), took about a fifth of a replica's
CPU when 10,000 sync python runs were due at one instant (py-spy: ~11 % in
``send_fds``, ~8.5 % in ``connect_read_pipe`` and its transport). So a warm
child is given one pipe, with its first attempt, and the worker reads it
with one reader (``loop.add_reader``) until the child is dropped.

The child writes a boundary marker to the pipe after an attempt it will
reuse itself for (``warm_child.py``): ``MARK`` and a nonce of 16 random bytes
made here, per child, so a job's ordinary output never matches it by
accident. The reader routes bytes to the attempt's :class:`Tail` until the
marker (found when a read cuts it in two), and drops what comes between an
attempt's marker and the next attempt (nothing should: see ``warm_child``).
A child that is not reused writes no marker: its attempt's output ends when
the pipe's last writer is gone (the child and its swept group), read for a
bounded time, as a shell job's pipe is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from actors.adapters.executors.common import Tail
from actors.observability import get_logger

MARK = b"\x00claimd-attempt-end:"
NONCE_BYTES = 16
READ_BYTES = 65536
DRAIN_S = 2.0  # as drain_output: a process outside the child's group may hold the pipe


class ChildOutput:
    """The worker's end of one warm child's output pipe, routed to the attempt running."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.nonce = os.urandom(NONCE_BYTES)
        self.marker = MARK + self.nonce
        read_fd, self.write_fd = os.pipe()  # the write end goes to the child, then is closed
        os.set_blocking(read_fd, False)
        self._fd: int | None = read_fd
        self._loop = loop
        self._tail: Tail | None = None
        self._held = b""  # a read's end that may begin the marker, not routed yet
        self._ended: asyncio.Future[bool] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        loop.add_reader(read_fd, self._readable)

    def handed(self) -> None:
        """The child holds its own copy of the write end (or never will): ours goes."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def begin(self, tail: Tail) -> asyncio.Future[bool]:
        """Route what comes next to ``tail`` until the marker; the future is True at it
        (False if the pipe ended first: no marker can come)."""
        self._tail, self._held = tail, b""
        self._ended = self._loop.create_future()
        if self.eof.done():
            self._ended.set_result(False)  # no more output can come
        return self._ended

    def stop(self) -> None:
        """The attempt is over: what comes now is no attempt's."""
        self._tail, self._held = None, b""

    async def finish(self, limit: float = DRAIN_S) -> None:
        """Read until every writer has closed the pipe, ``limit`` seconds at most."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.eof), limit)
        self._flush_held()

    def close(self) -> None:
        """Stop reading (the child is dropped); idempotent, safe on a closed loop."""
        self.handed()
        self.stop()
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(Exception):  # the loop may be closed (a test's, ended)
            self._loop.remove_reader(fd)
        os.close(fd)
        with contextlib.suppress(RuntimeError):  # a closed loop's future, with a waiter
            if not self.eof.done():
                self.eof.set_result(None)
            if not self._ended.done():
                self._ended.set_result(False)

    def _readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            get_logger("executor").warning(
                "reading a python child's output failed", error=repr(exc)
            )
            data = b""
        if data:
            self.route(data)
            return
        self._flush_held()  # the end of the file: a held marker's beginning was output
        self.close()

    def route(self, data: bytes) -> None:
        """Bytes read: the attempt's, up to the marker; the marker ends the attempt."""
        tail = self._tail
        if tail is None:
            return
        if self._held:
            data, self._held = self._held + data, b""
        found = data.find(self.marker)
        if found >= 0:
            if found:
                tail.add(data[:found])
            self.stop()  # what follows the marker is no attempt's
            if not self._ended.done():
                self._ended.set_result(True)
            return
        keep = self._prefix_at_end(data)
        if keep:
            data, self._held = data[:-keep], data[-keep:]
        if data:
            tail.add(data)

    def _prefix_at_end(self, data: bytes) -> int:
        """How many of the last bytes of ``data`` could begin the marker (0 most often:
        it begins with a NUL byte, rare in output)."""
        start = max(0, len(data) - len(self.marker) + 1)
        while (at := data.find(MARK[:1], start)) >= 0:
            if self.marker.startswith(data[at:]):
                return len(data) - at
            start = at + 1
        return 0

    def _flush_held(self) -> None:
        if self._held and self._tail is not None:
            self._tail.add(self._held)
        self._held = b""

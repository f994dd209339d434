"""A TCP fault proxy: what an operator's network does between a replica and a server.

One proxy listens on a loopback port and forwards every connection to one
server (TCP ``host:port``, or PostgreSQL's unix socket). The harness puts one
proxy per server in front of each replica, so a fault hits one replica's link
and not the others'. Modes:

``pass``
    bytes flow both ways.
``reset``
    every open connection is reset (``SO_LINGER`` 0, then close: an RST to
    both ends), and so is every connection accepted while the mode holds.
    :meth:`FaultProxy.reset_all` resets once and leaves the mode as it is.
``blackhole``
    bytes are dropped both ways and nothing is closed or reset: a NAT table
    expiry, a dead switch, a load balancer that forgot the flow. Every
    connection open when the blackhole starts, or accepted during it, is caught
    and stays dead after the heal (its flow is gone); only connections made
    after the heal pass. A caught connection's server end is closed after
    ``server_gives_up`` seconds, as the server's own keepalive or pings would
    (the proxy's kernel answers the server's probes, so the proxy plays that
    part); the client end is only ever closed by the client.
``slow``
    every chunk is delivered ``latency`` seconds after it was read, in order.

What the proxy cannot show: its own kernel acknowledges the bytes it then
drops, so TCP keepalive and ``TCP_USER_TIMEOUT`` on the client's socket never
fire against it. What a blackhole here tests is that the application's own
deadlines (statement timeouts, NATS pings, fetch and publish timeouts) notice a
silent peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 65536


class Mode(enum.StrEnum):
    PASS = "pass"
    RESET = "reset"
    BLACKHOLE = "blackhole"
    SLOW = "slow"


@dataclass(frozen=True)
class Upstream:
    """Where a proxy forwards to: ``host``/``port`` over TCP, or a unix socket ``path``."""

    host: str = "127.0.0.1"
    port: int = 0
    path: Path | None = None

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.path is not None:
            return await asyncio.open_unix_connection(str(self.path))
        return await asyncio.open_connection(self.host, self.port)

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else f"{self.host}:{self.port}"


@dataclass
class ProxyStats:
    accepted: int = 0
    reset: int = 0  # connections reset (each counted once)
    caught: int = 0  # connections caught in a blackhole (each counted once)
    refused_upstream: int = 0  # the server could not be reached: the client end closed
    dropped_bytes: int = 0  # read from one end and never delivered to the other


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST rather than a FIN (SO_LINGER on, timeout 0)."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None and not writer.transport.is_closing():
        writer.transport.close()


@dataclass(eq=False)
class _Connection:
    client_reader: asyncio.StreamReader
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    caught: bool = False
    done: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    gives_up: asyncio.TimerHandle | None = None


class FaultProxy:
    """One listening port forwarding to ``upstream``, with a mode the harness switches."""

    def __init__(self, name: str, upstream: Upstream, *, server_gives_up: float = 6.0) -> None:
        self.name = name
        self.upstream = upstream
        self.server_gives_up = server_gives_up
        self.mode = Mode.PASS
        self.latency = 0.0
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- the harness's switches ------------------------------------------------------

    def set_mode(self, mode: Mode, *, latency: float = 0.0) -> None:
        """Switch the mode; entering ``reset`` or ``blackhole`` acts on open connections."""
        self.mode = mode
        self.latency = latency if mode is Mode.SLOW else 0.0
        if mode is Mode.RESET:
            self.reset_all()
        elif mode is Mode.BLACKHOLE:
            for conn in list(self._connections):
                self._catch(conn)

    def reset_all(self) -> int:
        """Reset every open connection now (caught ones too); returns how many."""
        conns = list(self._connections)
        for conn in conns:
            self._reset(conn)
        return len(conns)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            self._finish(conn, rst=True)
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # -- connections -----------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        conn = _Connection(reader, writer)
        self._connections.add(conn)
        if self.mode is Mode.RESET:
            self._reset(conn)
            return
        if self.mode is Mode.BLACKHOLE:
            # The SYN of a real blackhole never reaches the server: no upstream at all.
            self._catch(conn)
        else:
            try:
                upstream_reader, conn.upstream = await self.upstream.open()
            except OSError:
                self.stats.refused_upstream += 1
                self._finish(conn, rst=False)
                return
            if conn.done:  # reset while connecting
                self._finish(conn, rst=True)
                return
            if conn.caught:  # caught while connecting: the server end waits to give up
                self._schedule_give_up(conn)
            conn.tasks.append(
                asyncio.create_task(
                    self._pump(conn, upstream_reader, conn.client, from_client=False)
                )
            )
        conn.tasks.append(
            asyncio.create_task(self._pump(conn, reader, conn.upstream, from_client=True))
        )
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._connections.discard(conn)

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter | None,
        *,
        from_client: bool,
    ) -> None:
        """Copy one direction; the writer task delivers with the latency of the moment."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(conn, queue, writer))
        try:
            while True:
                try:
                    data = await reader.read(CHUNK)
                except (OSError, ConnectionError):
                    data = b""
                if not data:
                    break
                if conn.caught or conn.done or writer is None:
                    # Dropped: nothing reaches the other end, nothing is closed.
                    self.stats.dropped_bytes += len(data)
                    continue
                queue.put_nowait((time.monotonic() + self.latency, data))
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await deliver
        self._ended(conn, from_client=from_client)

    async def _deliver(
        self,
        conn: _Connection,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter | None,
    ) -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if conn.caught or conn.done or writer is None or writer.transport.is_closing():
                self.stats.dropped_bytes += len(data)
                continue
            writer.write(data)
            with contextlib.suppress(OSError, ConnectionError):
                await writer.drain()

    def _ended(self, conn: _Connection, *, from_client: bool) -> None:
        """One end closed (EOF, reset): what the other end sees depends on the fault."""
        if conn.done:
            return
        if not conn.caught:
            # A closed end is passed on as a close (not a half-close: neither the
            # PostgreSQL nor the NATS protocol uses one).
            self._finish(conn, rst=False)
            return
        # Caught: the other end hears nothing. The client closing its end is
        # the client giving up; the server end lives on until it gives up too.
        if from_client:
            _close(conn.client)
            if conn.upstream is None or conn.upstream.transport.is_closing():
                self._finish(conn, rst=False)
        else:
            _close(conn.upstream)

    def _catch(self, conn: _Connection) -> None:
        if conn.caught or conn.done:
            return
        conn.caught = True
        self.stats.caught += 1
        if conn.upstream is not None:
            self._schedule_give_up(conn)

    def _schedule_give_up(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        conn.gives_up = loop.call_later(self.server_gives_up, _close, conn.upstream)

    def _reset(self, conn: _Connection) -> None:
        if not conn.done:
            self.stats.reset += 1
        self._finish(conn, rst=True)

    def _finish(self, conn: _Connection, *, rst: bool) -> None:
        conn.done = True
        if conn.gives_up is not None:
            conn.gives_up.cancel()
        for writer in (conn.client, conn.upstream):
            if rst:
                with contextlib.suppress(Exception):
                    _rst(writer)
            else:
                _close(writer)
        self._connections.discard(conn)

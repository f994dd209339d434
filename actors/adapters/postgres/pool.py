"""Connections with deadlines: the pool, its connect, TCP keepalive."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg

from actors.domain import TimeoutBudget


def split_hosts(dsn: str) -> list[str]:
    """One single-host URL per host of a multi-host URL, in order.

    ``postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write`` ->
    ``postgresql://u@h1:5432/db?...`` and ``postgresql://u@h2:5433/db?...``.
    Anything else (one host, a key=value DSN, hosts in the query) is returned whole.
    """
    scheme, sep, rest = dsn.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        return [dsn]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [f"{scheme}://{userinfo}{at}{host}{rest[end:]}" for host in hosts.split(",")]


class _HostByHost:
    """The pool's connect: one host at a time, each attempt with its own deadline.

    asyncpg tries the hosts of a multi-host URL in order under one timeout, so a
    first host that drops packets (a dead machine, not a refused port) would use
    it all up and the next host would never be tried. Here each host gets the
    connect timeout, the host that answered last is tried first, and a host
    that fails (or whose attempt is cut short by the pool's acquire timeout)
    goes to the back for the next attempt. ``target_session_attrs`` in the URL
    still applies per host: a standby is passed over until it is promoted.
    """

    def __init__(self, dsn: str, timeout: timedelta) -> None:
        self.dsns = split_hosts(dsn)
        self.timeout = timeout.total_seconds()
        self._next = 0

    async def __call__(self, _dsn: str, **kwargs: Any) -> asyncpg.Connection:
        kwargs.pop("timeout", None)
        error: Exception | None = None
        for _ in self.dsns:
            index = self._next
            self._next = (index + 1) % len(self.dsns)
            try:
                conn = await asyncpg.connect(self.dsns[index], timeout=self.timeout, **kwargs)
            except Exception as exc:  # noqa: BLE001 - libpq too goes on to the next host
                error = exc
                continue
            self._next = index
            return conn
        assert error is not None
        raise error


def _keepalive_connection_class(timeouts: TimeoutBudget) -> type[asyncpg.Connection]:
    """Connections whose socket notices a silent peer (TCP keepalive, TCP_USER_TIMEOUT).

    asyncpg has no keepalive options (MagicStack/asyncpg#606), but every
    connection it makes is built from this class with its transport.
    """
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", int(timeouts.keepalive_idle.total_seconds())),
        ("TCP_KEEPINTVL", int(timeouts.keepalive_interval.total_seconds())),
        ("TCP_KEEPCNT", timeouts.keepalive_count),
        # Data sent but never acknowledged (a blackhole) fails the socket too.
        ("TCP_USER_TIMEOUT", int(timeouts.database_dead_after().total_seconds() * 1000)),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))

    class KeepaliveConnection(asyncpg.Connection):
        def __init__(self, protocol: Any, transport: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(protocol, transport, *args, **kwargs)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                for level, option, value in options:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(level, option, value)

    return KeepaliveConnection


class _BoundedPool(asyncpg.Pool):
    """A pool whose acquire (and so the release after it) has a deadline by default.

    asyncpg's release waits for the cancel of a timed-out statement and for a
    reset; without a deadline that is another wait on a silent connection.
    """

    def __init__(self, *args: Any, acquire_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acquire_timeout = acquire_timeout

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self._acquire_timeout if timeout is None else timeout)


async def keep_session(conn: asyncpg.Connection) -> None:
    """What the pool does to a connection it takes back: nothing more than asyncpg must.

    asyncpg's default reset is a second round trip after every statement
    (``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``),
    about 0.3 ms and 0.15 ms of client CPU each time. claimd's pooled
    connections keep no session state: no SET outside a transaction, no
    LISTEN, no cursor, and the one advisory lock (migrations) is released by
    the migration and reset there in full. asyncpg still rolls back a
    transaction left open and drops listeners before calling this.
    """


async def connect_pool(
    dsn: str,
    timeouts: TimeoutBudget,
    *,
    min_size: int = 1,
    max_size: int = 10,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    """An asyncpg pool whose every wait is bounded by the lease-derived ``timeouts``.

    A statement by ``statement_timeout`` (asyncpg's command timeout: the client
    stops waiting and cancels it), taking and returning a connection by
    ``acquire_timeout``, one connection attempt per host by ``connect_timeout``.
    TCP keepalive on both ends drops a connection whose peer went silent while
    idle: the client's socket options, and the server's ``tcp_keepalives_*``
    session settings (so the server frees the backend and its locks).
    """
    idle = int(timeouts.keepalive_idle.total_seconds())
    interval = int(timeouts.keepalive_interval.total_seconds())
    server_keepalive = {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(timeouts.keepalive_count),
        "tcp_user_timeout": str(int(timeouts.database_dead_after().total_seconds() * 1000)),
        # No JIT: every statement here reads a few index ranges, but one whose
        # estimate crosses jit_above_cost (a plan over stale statistics) was
        # compiled on every call: ~30 ms of JIT for a claim that ran in 0.1 ms.
        "jit": "off",
    }
    pool = _BoundedPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        loop=None,
        init=init,
        connect=_HostByHost(dsn, timeouts.connect_timeout),
        connection_class=_keepalive_connection_class(timeouts),
        record_class=asyncpg.Record,
        acquire_timeout=timeouts.acquire_timeout.total_seconds(),
        command_timeout=timeouts.statement_timeout.total_seconds(),
        server_settings=server_keepalive,
        reset=keep_session,
    )
    await pool
    return pool


async def init_connection(conn: asyncpg.Connection) -> None:
    """Set up each new connection of the store's pool."""
    # jsonb as text both ways: we decode where needed, and never build SQL from it.
    await conn.set_type_codec("jsonb", encoder=str, decoder=str, schema="pg_catalog")

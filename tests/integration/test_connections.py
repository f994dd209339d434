"""Connections with deadlines from the lease, and their state changes said out loud.

On the real servers: the pool's sockets carry TCP keepalive (client and server
side), a statement stuck past the statement timeout fails instead of waiting,
closing the pool is bounded even while a connection is held, and losing and
regaining PostgreSQL or NATS is one log event and a metric each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from actors.adapters.embedded import EmbeddedNats, free_port
from actors.adapters.nats import JetStreamBroker, StreamSettingsRefused
from actors.adapters.postgres import PostgresRunStore
from actors.domain import TimeoutBudget
from actors.ports import StoreUnavailable
from tests.integration.helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

S = timedelta(seconds=1)
# A 6s lease: statements 750ms, acquire 375ms, close 1s, NATS pings every 1s.
BUDGET = TimeoutBudget.from_settings(6 * S, S, 2)


def sample(name: str, dependency: str) -> float:
    return REGISTRY.get_sample_value(name, {"dependency": dependency}) or 0.0


@pytest.fixture
async def short_store(schema_url: str) -> AsyncIterator[PostgresRunStore]:
    store = await PostgresRunStore.connect(schema_url, max_size=2, timeouts=BUDGET)
    await store.migrate()
    yield store
    await store.close()


async def test_pool_connections_keepalive_on_both_ends_and_the_budgets_statement_timeout(
    short_store: PostgresRunStore,
) -> None:
    async with short_store.pool.acquire() as conn:
        raw = conn._con  # the pool's proxy hides the connection; its socket is what we check
        sock = raw._transport.get_extra_info("socket")
        assert raw._config.command_timeout == pytest.approx(0.75)
        if sock.family == socket.AF_UNIX:
            # The embedded server (no CLAIMD_TEST_DATABASE_URL) is reached over a
            # Unix socket, where TCP keepalive does not exist on either end.
            pytest.skip("keepalive is TCP's: this test database is on a Unix socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 4000
        # The server side: it drops a client that went silent, and frees its locks.
        assert await conn.fetchval("SHOW tcp_keepalives_idle") in ("1", "1s")
        assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"


async def test_a_statement_stuck_past_the_statement_timeout_fails_and_is_said(
    short_store: PostgresRunStore, schema_url: str
) -> None:
    admin = await asyncpg.connect(schema_url)
    try:
        # The claim waits for a lock that is never released while it waits: like a
        # server that stopped answering, only the statement timeout ends the wait.
        await admin.execute("BEGIN; LOCK TABLE job_runs IN ACCESS EXCLUSIVE MODE")
        with capture_logs() as logs:
            async with asyncio.timeout(30):  # a deadline for a hang, far above 750ms
                with pytest.raises(StoreUnavailable, match="TimeoutError"):
                    await short_store.claim_due_runs("me", 10, timedelta(minutes=1), 100)
        assert sample("claimd_dependency_up", "postgres") == 0
        assert [e for e in logs if e["event"] == "postgres unreachable"], logs
        await admin.execute("ROLLBACK")
    finally:
        await admin.close()
    reconnects = sample("claimd_reconnects_total", "postgres")
    with capture_logs() as logs:
        assert await short_store.claim_due_runs("me", 10, timedelta(minutes=1), 100) == []
    assert sample("claimd_dependency_up", "postgres") == 1
    assert sample("claimd_reconnects_total", "postgres") == reconnects + 1
    assert [e["event"] for e in logs] == ["postgres reachable again"]


async def test_closing_the_pool_is_bounded_while_a_connection_is_held(schema_url: str) -> None:
    store = await PostgresRunStore.connect(schema_url, max_size=2, timeouts=BUDGET)
    held = await store.pool.acquire()  # never released: Pool.close() alone waits for it
    try:
        with capture_logs() as logs:
            async with asyncio.timeout(30):  # a deadline for a hang, far above the 1s bound
                await store.close()
        assert [e for e in logs if e["event"].startswith("database pool did not close")]
        assert held._con is None or held._con.is_closed()  # terminated, not waited for
    finally:
        with contextlib.suppress(Exception):
            await store.pool.release(held)


async def gauge_becomes(dependency: str, value: float) -> None:
    async def reads_value() -> bool:
        return sample("claimd_dependency_up", dependency) == value

    await eventually(
        reads_value, timeout=30, what=f"claimd_dependency_up{{{dependency}}} = {value}"
    )


async def test_losing_and_regaining_nats_is_one_event_and_a_metric_each_way(
    deployment: str,
) -> None:
    server = EmbeddedNats(Path(tempfile.mkdtemp(prefix="claimd-test-nats-")), free_port())
    server.start()
    try:
        with capture_logs() as logs:
            broker = await JetStreamBroker.connect(
                server.url, f"CLAIMD_{deployment}", f"claimd.{deployment}.runs", timeouts=BUDGET
            )
            try:
                assert sample("claimd_dependency_up", "nats") == 1
                reconnects = sample("claimd_reconnects_total", "nats")
                server.stop()

                await gauge_becomes("nats", 0)
                server.start()  # the same port: the client's reconnect loop finds it
                await gauge_becomes("nats", 1)
                assert sample("claimd_reconnects_total", "nats") == reconnects + 1
            finally:
                await broker.close()
        events = [e["event"] for e in logs]
        assert events.count("nats unreachable") == 1, events
        assert events.count("nats reachable again") == 1, events
        assert events[-1] == "nats connection closed", events
        assert "nats unreachable" not in events[events.index("nats reachable again") :]
    finally:
        server.stop()


async def test_a_single_server_refuses_three_stream_replicas_clearly(
    nats_url: str, deployment: str
) -> None:
    broker = await JetStreamBroker.connect(
        nats_url, f"CLAIMD_{deployment}", f"claimd.{deployment}.runs", timeouts=BUDGET
    )
    try:
        with pytest.raises(StreamSettingsRefused) as info:
            await broker.ensure_stream(timedelta(minutes=2), replicas=3)
        message = str(info.value)
        assert f"refused stream CLAIMD_{deployment} with 3 replica(s)" in message
        assert "stream_replicas must not exceed the JetStream servers" in message
        await broker.ensure_stream(timedelta(minutes=2), replicas=1)  # what it can hold
    finally:
        await broker.close()


async def test_a_silent_first_host_of_a_multi_host_url_is_passed_over(database_url: str) -> None:
    # A port that accepts TCP connections and never answers: a host that died
    # without refusing anything. asyncpg alone spends its whole connect timeout
    # there and never tries the next host; each host gets its own deadline here.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        parts = urlsplit(database_url)
        userinfo, _, hostport = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@127.0.0.1:{silent.getsockname()[1]},{hostport}"
        dsn = urlunsplit(parts._replace(netloc=netloc))
        async with asyncio.timeout(30):  # a deadline for a hang, far above 1s per host
            store = await PostgresRunStore.connect(dsn, min_size=2, max_size=2, timeouts=BUDGET)
            try:
                await store.ping()
            finally:
                await store.close()

"""The fault proxy's modes, against a loopback echo server (no claimd involved)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from tests.chaos.proxy import FaultProxy, Mode, Upstream

pytestmark = pytest.mark.timeout(30)


@dataclass
class Echo:
    """Echoes every byte back; counts what it received and which connections ended."""

    received: int = 0
    ended: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while data := await reader.read(4096):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            self.ended += 1
            writer.close()


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def rig() -> AsyncIterator[tuple[Echo, FaultProxy]]:
    echo = Echo()
    echo.server = await asyncio.start_server(echo.serve, "127.0.0.1", 0)
    port = echo.server.sockets[0].getsockname()[1]
    proxy = await FaultProxy("test", Upstream(port=port), server_gives_up=0.2).start()
    try:
        yield echo, proxy
    finally:
        await proxy.close()
        echo.server.close()


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), 5)


async def test_pass_forwards_both_ways(rig: tuple[Echo, FaultProxy]) -> None:
    _, proxy = rig
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"hello") == b"hello"
    writer.close()


async def test_slow_delivers_everything_in_order(rig: tuple[Echo, FaultProxy]) -> None:
    _, proxy = rig
    proxy.set_mode(Mode.SLOW, latency=0.05)
    reader, writer = await _connect(proxy)
    payload = b"".join(i.to_bytes(4, "big") for i in range(20_000))
    assert await _round_trip(reader, writer, payload) == payload
    writer.close()


async def test_reset_sends_an_rst_to_both_ends(rig: tuple[Echo, FaultProxy]) -> None:
    echo, proxy = rig
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"x") == b"x"
    assert proxy.reset_all() == 1
    with pytest.raises(ConnectionResetError):
        # An RST, not a FIN: a FIN would read as b"" (end of stream).
        await asyncio.wait_for(reader.read(1), 5)
    await _until(lambda: echo.ended == 1, "the server end to be closed")
    # The mode is still pass: a new connection works.
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"y") == b"y"
    writer.close()


async def test_reset_mode_resets_new_connections(rig: tuple[Echo, FaultProxy]) -> None:
    _, proxy = rig
    proxy.set_mode(Mode.RESET)
    reader, _ = await _connect(proxy)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), 5)


async def test_blackhole_drops_silently_and_caught_connections_stay_dead(
    rig: tuple[Echo, FaultProxy],
) -> None:
    echo, proxy = rig
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"ab") == b"ab"
    proxy.set_mode(Mode.BLACKHOLE)
    # A connection made during the blackhole is caught too, and never reaches the server.
    new_reader, new_writer = await _connect(proxy)
    for w in (writer, new_writer):
        w.write(b"lost")
        await w.drain()
    await _until(lambda: proxy.stats.dropped_bytes >= 8, "the proxy to drop the bytes")
    assert echo.received == 2
    assert len(echo.writers) == 1
    # Server -> client is dropped too.
    echo.writers[0].write(b"reply")
    await echo.writers[0].drain()
    await _until(lambda: proxy.stats.dropped_bytes >= 13, "the reply to be dropped")
    proxy.set_mode(Mode.PASS)  # the heal
    writer.write(b"after")
    await writer.drain()
    await _until(lambda: proxy.stats.dropped_bytes >= 18, "bytes after the heal to be dropped")
    assert echo.received == 2
    # Nothing was closed or reset on the client's side: a read just waits.
    for r in (reader, new_reader):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(1), 0.2)
    # The server end of the caught connection is closed after server_gives_up.
    await _until(lambda: echo.ended == 1, "the server to give up on the caught connection")
    # A connection made after the heal passes.
    fresh_reader, fresh_writer = await _connect(proxy)
    assert await _round_trip(fresh_reader, fresh_writer, b"ok") == b"ok"
    for w in (writer, new_writer, fresh_writer):
        w.close()
    assert proxy.stats.caught == 2


async def test_a_client_that_gives_up_on_a_caught_connection_is_let_go(
    rig: tuple[Echo, FaultProxy],
) -> None:
    _, proxy = rig
    proxy.set_mode(Mode.BLACKHOLE)
    _, writer = await _connect(proxy)
    await _until(lambda: proxy.open_connections == 1, "the connection to be accepted")
    writer.close()
    await _until(lambda: proxy.open_connections == 0, "the caught connection to be let go")


async def test_unreachable_server_closes_the_client_end() -> None:
    probe = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    proxy = await FaultProxy("dead", Upstream(port=port)).start()
    try:
        reader, writer = await _connect(proxy)
        assert await asyncio.wait_for(reader.read(1), 5) == b""
        assert proxy.stats.refused_upstream == 1
        writer.close()
    finally:
        await proxy.close()

"""The HTTP face's guard: tokens and their scopes, Host names, the connection cap, the
shared /metrics page."""

from __future__ import annotations

import asyncio
import resource
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from actors.config import parse_config
from actors.http.api import OperatorApi
from actors.http.guard import Guard, Tokens, _host_name, connection_cap
from actors.http.openapi import Scope, document
from actors.http.server import MetricsPage, build_app, serve
from actors.operator import OperatorService, Unauthorized

READ = "r" * 24
OPERATE = "o" * 40


def test_a_token_is_known_by_its_digest_whatever_its_length() -> None:
    tokens = Tokens([("viewer", READ, "read"), ("ops", OPERATE)])
    assert tokens.identify(f"Bearer {READ}") == ("viewer", Scope.READ)
    assert tokens.identify(f"bearer  {OPERATE} ") == ("ops", Scope.OPERATE)
    for wrong in (f"Bearer {READ[:-1]}", f"Bearer {READ}r", "Bearer x", f"Basic {READ}", ""):
        with pytest.raises(Unauthorized):
            tokens.identify(wrong)
    # What is compared is a digest of one length: a token's length is not in the timing.
    assert {len(tokens._digest(b"x" * n)) for n in (1, 16, 4096)} == {32}
    assert not Tokens().configured


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("Example.COM:8080", "example.com"),
        ("localhost.", "localhost"),
        ("[::1]:8780", "[::1]"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example:notaport", "evil.example:notaport"),
    ],
)
def test_the_host_header_name_is_read_without_its_port(header: str, name: str) -> None:
    assert _host_name(header) == name


def test_allowed_hosts_from_the_file_or_the_environment() -> None:
    text = '[claimd]\nallowed_hosts = ["Claimd.Internal"]\n'
    assert parse_config(text, "c.toml", env={}).settings.allowed_hosts == ["claimd.internal"]
    env = {"CLAIMD_ALLOWED_HOSTS": "a.example, b.example"}
    assert parse_config(text, "c.toml", env=env).settings.allowed_hosts == [
        "a.example",
        "b.example",
    ]


def test_the_connection_cap_is_at_most_a_quarter_of_the_file_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert connection_cap(512) == 256
    assert connection_cap(100) == 100
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    assert connection_cap(512) == 512


async def _ready() -> dict[str, Any]:
    return {"postgres": "ok", "nats": "ok"}


async def test_half_requests_past_the_cap_close_the_oldest_and_healthz_answers() -> None:
    """50 connections that send half a request, at a cap of 8: at most 8 are held (the
    oldest idle ones are closed for the new), and a health check is answered at once."""

    def closed_by_cap() -> float:
        value = REGISTRY.get_sample_value("claimd_http_refused_total", {"reason": "connection_cap"})
        return value or 0.0

    before = closed_by_cap()
    guard = Guard(max_connections=8, header_timeout_s=60)
    runner, port = await serve(build_app(_ready), "127.0.0.1", 0, guard)
    writers = []
    try:
        for _ in range(50):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            writers.append(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert runner.server is not None
        held = [t for t in runner.server._connections.values() if not t.is_closing()]
        assert len(held) <= 8
        assert closed_by_cap() - before >= 50 - 8  # claimd_http_refused_total{reason}
    finally:
        for writer in writers:
            writer.transport.abort()
        await runner.cleanup()


async def test_scrapes_within_a_second_share_one_render() -> None:
    renders: list[int] = []

    async def refresh() -> None:
        renders.append(1)

    page = MetricsPage(refresh, max_age=60)

    async def read() -> bytes:
        return b"".join([chunk async for chunk in page.current().read()])

    first, second = await asyncio.gather(read(), read())
    assert first == second
    assert first.startswith(b"# HELP")
    await read()  # within max_age of the render: the same page
    assert (page.renders, len(renders)) == (1, 1)
    first_task = page._task
    page.max_age = 0  # the page is now older than max_age: the next scrape renders
    await read()
    assert (page.renders, len(renders)) == (2, 2)
    for task in (first_task, page._task):
        assert task is not None
        task.cancel()


class _NoService:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the service was called ({name})")


async def test_a_body_that_trickles_past_the_body_timeout_answers_408() -> None:
    api = OperatorApi(cast(OperatorService, _NoService()), [("ops", OPERATE)])
    guard = Guard(tokens=api.tokens, body_timeout_s=0.3)
    runner, port = await serve(build_app(_ready, api, guard=guard), "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /api/jobs/nightly/trigger HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + OPERATE.encode() + b"\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"at": '
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408"), head
        writer.transport.abort()
    finally:
        await runner.cleanup()


async def test_metrics_token_guards_metrics_and_the_document_says_each_scope() -> None:
    api = OperatorApi(
        cast(OperatorService, _NoService()), [("viewer", READ, "read")], metrics_token=True
    )
    async with TestClient(TestServer(build_app(_ready, api))) as client:
        async with client.get("/metrics") as response:
            assert response.status == 401
        headers = {"Authorization": f"Bearer {READ}"}
        async with client.get("/metrics", headers=headers) as response:
            assert response.status == 200
        async with client.get("/openapi.json") as response:  # always open
            doc = await response.json()
    operations = [op for path in doc["paths"].values() for op in path.values()]
    assert all(op["x-claimd-scope"] in ("open", "read", "operate") for op in operations)
    metrics = doc["paths"]["/metrics"]["get"]
    assert (metrics["x-claimd-scope"], metrics["security"]) == ("read", [{"bearerAuth": []}])
    assert "401" in metrics["responses"]
    jobs = doc["paths"]["/api/jobs"]["get"]
    assert "401" in jobs["responses"]
    assert "403" not in jobs["responses"]
    # Without tokens the reads are open, and the document says so; actions keep theirs.
    open_doc = document(False, False)
    assert "security" not in open_doc["paths"]["/api/jobs"]["get"]
    assert "401" not in open_doc["paths"]["/api/jobs"]["get"]["responses"]
    pause = open_doc["paths"]["/api/jobs/{name}/pause"]["post"]
    assert (pause["x-claimd-scope"], set(pause["responses"]) >= {"401", "403"}) == (
        "operate",
        True,
    )
    healthz = doc["paths"]["/healthz"]["get"]
    assert "security" not in healthz

"""Hostile bytes at every route of a live replica: always a JSON 4xx, never a 500 or text/plain.

The routes come from the operations table the server adds its routes from
(actors/http/openapi/operations.py), plus the status page's files; each path
parameter, query parameter and body is given bytes no client should send. The
defects found by schemathesis and by hand are tests of their own below, each
through the HTTP port.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.http.openapi import OPERATIONS, Operation
from tests.integration.test_operator_api import FAST, JOBS, TOKEN, api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Percent-encoded as sent: NUL, an invalid UTF-8 byte, an overlong '/', a lone surrogate,
# an encoded slash, dot segments, a newline, a space, an emoji, and a long segment.
SEGMENTS = [
    "%00",
    "%FF",
    "%C0%AF",
    "%ED%A0%80",
    "a%2Fb",
    "..",
    "%2e%2e",
    "%0A",
    "%20",
    "%F0%9F%98%80",
    "n" * 4000,
]
# No parameter takes these; the ones after may be a job's name, so they need only be no 500.
REFUSED_VALUES = [*SEGMENTS, "", "%E2%80%AEnow", "now%00", "true%00"]
ODD_VALUES = ["-1", "9" * 30, "1e309", "0x10"]
BODIES: list[tuple[bytes, str | None]] = [
    (b"\xff\xfe{", "application/json"),
    (b"{", "application/json"),
    (b"[" * 100_000, "application/json"),
    (b'{"at": "\\ud800"}', "application/json"),
    (b'{"at": "\\u0000", "from": "\\u0000", "to": 1}', "application/json"),
    (b"null", "application/json"),
    (b'{"max_runs": 1e400, "from": "now", "to": "now"}', "application/json"),
    (b'{"at": "now"}', "text/plain"),
    (b"at=now", "application/x-www-form-urlencoded"),
    (b"\x00" * 64, None),
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUN_ID = "0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b"


async def send(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None = None,
    content_type: str | None = None,
) -> tuple[int, str, Any]:
    """The request as written (``encoded=True``: no re-quoting); (status, media type, JSON)."""
    headers = dict(AUTH)
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with http.request(
        method,
        URL(url, encoded=True),
        data=body,
        headers=headers,
        skip_auto_headers=["Content-Type"],
    ) as response:
        text = await response.read()
        try:
            data = json.loads(text)
        except ValueError:
            data = text[:200]
        return response.status, response.content_type, data


def fill(path: str, value: str) -> str:
    return re.sub(r"\{[a-z_]+\}", value, path)


def _query_names(op: Operation | None) -> list[str]:
    if op is None or op.query is None:
        return []
    return [f.alias or name for name, f in op.query.model_fields.items()]


def hostile_requests() -> list[tuple[str, str, bytes | None, str | None, bool]]:
    """(method, target, body, content type, whether the route must refuse it: 4xx)."""
    out: list[tuple[str, str, bytes | None, str | None, bool]] = []
    routes: list[tuple[str, str, Operation | None]] = [
        (op.method.upper(), op.path, op) for op in OPERATIONS
    ]
    routes.append(("GET", "/static/{name}", None))
    for method, path, op in routes:
        if "{" in path:
            for segment in SEGMENTS:
                out.append((method, fill(path, segment), None, None, True))
        ok_path = fill(path, "nightly" if "{name}" in path and op else RUN_ID)
        if op is None:
            ok_path = fill(path, "status.js")
        for name in _query_names(op):
            for value in REFUSED_VALUES:
                out.append((method, f"{ok_path}?{name}={value}", None, None, True))
            for value in ODD_VALUES:
                out.append((method, f"{ok_path}?{name}={value}", None, None, False))
        out.append((method, f"{ok_path}?%FF=%FF&&=&%00", None, None, False))
        if op is not None and op.body is not None:
            for body, content_type in BODIES:
                out.append((method, ok_path, body, content_type, True))
    return out


async def test_every_route_answers_hostile_bytes_with_a_json_4xx(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    cases = hostile_requests()
    assert len(cases) > 300
    async with (
        api(make_config(JOBS, api_token_file=str(tokens), **FAST), tmp_path, store) as base,
        aiohttp.ClientSession() as http,
    ):
        wrong = []
        for method, target, body, content_type, refused in cases:
            status, media, data = await send(http, method, base + target, body, content_type)
            answered = status < 400 or (
                media == "application/json"
                and isinstance(data, dict)
                and isinstance(data.get("error"), str)
            )
            if status >= 500 or not answered or (refused and not 400 <= status < 500):
                wrong.append((method, target[:80], body and body[:40], status, media, data))
    assert not wrong, "\n".join(map(str, wrong[:40]))


async def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, str, Any]:
    """Bytes on a socket, for what an HTTP client would refuse to send."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n")
        if body:
            writer.write(b"Content-Type: application/json\r\n")
            writer.write(b"Content-Length: %d\r\n" % len(body))
        writer.write(b"\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    header, _, payload = answer.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    media = next(
        (
            line.split(":", 1)[1].split(";")[0].strip()
            for line in lines
            if line.lower().startswith("content-type:")
        ),
        "",
    )
    try:
        return status, media, json.loads(payload)
    except ValueError:
        return status, media, payload[:200]


# Each a defect of the server before its requests were read through the document's models:
# (what, request head, body, the status it must answer). The first five were 500s with a
# traceback; the raw bytes and the two 404s were text/plain or empty; a parameter given twice
# was taken once, silently.
DEFECTS = [
    ("NUL in a job's name reached SQL", b"GET /api/jobs/%00 HTTP/1.1", b"", 400),
    (
        "an audit at the calendar's end overflowed",
        b"GET /api/jobs/nightly/audit?from=9999-12-31T23:59:59-23:59&to=9999-12-31T23:59:59-23:59"
        b" HTTP/1.1",
        b"",
        400,
    ),
    (
        "a time before year 1 in UTC overflowed",
        b"GET /api/runs?since=0001-01-01T00:00:00%2B14:00 HTTP/1.1",
        b"",
        400,
    ),
    (
        "a cursor before year 1 in UTC overflowed in the driver",
        b"GET /api/runs?cursor=0001-01-01T00:00:00%2B14:00~0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b"
        b" HTTP/1.1",
        b"",
        400,
    ),
    (
        "deeply nested JSON recursed",
        b"POST /api/jobs/nightly/trigger HTTP/1.1",
        b"[" * 100_000,
        400,
    ),
    ("a raw invalid UTF-8 byte in the path", b"GET /api/jobs/\xff HTTP/1.1", b"", 400),
    (
        "a request line over 8190 bytes",
        b"GET /api/runs?job=" + b"n" * 9000 + b" HTTP/1.1",
        b"",
        400,
    ),
    ("a file the status page does not have", b"GET /static/nothing.js HTTP/1.1", b"", 404),
    ("a route nobody declared", b"GET /nothing HTTP/1.1", b"", 404),
    ("a scalar parameter given twice", b"GET /api/runs?limit=1&limit=2000 HTTP/1.1", b"", 400),
    (
        "a file name too long for the file system was called a database outage (503)",
        b"GET /static/" + b"n" * 4000 + b" HTTP/1.1",
        b"",
        404,
    ),
]


@pytest.mark.parametrize(("what", "head", "body", "expected"), DEFECTS, ids=[d[0] for d in DEFECTS])
async def test_a_defect_answers_a_json_error(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    tmp_path: Path,
    what: str,
    head: bytes,
    body: bytes,
    expected: int,
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    async with api(make_config(JOBS, api_token_file=str(tokens), **FAST), tmp_path, store) as base:
        port = int(base.rsplit(":", 1)[1])
        auth = f"\r\nAuthorization: Bearer {TOKEN}".encode()
        status, media, data = await raw_request(port, head + auth, body)
    assert (status, media) == (expected, "application/json"), (what, status, media, data)
    assert isinstance(data, dict), (what, data)
    assert isinstance(data["error"], str), (what, data)


async def test_a_body_not_sent_as_json_is_refused_with_415(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """curl's -d sends application/x-www-form-urlencoded: once taken as JSON, now 415."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    async with (
        api(make_config(JOBS, api_token_file=str(tokens), **FAST), tmp_path, store) as base,
        aiohttp.ClientSession() as http,
    ):
        trigger = base + "/api/jobs/nightly/trigger"
        body = b'{"at": "2026-06-01 02:00"}'
        status, _, data = await send(
            http, "POST", trigger, body, "application/x-www-form-urlencoded"
        )
        assert status == 415, data
        assert "application/json" in data["error"]
        status, _, data = await send(http, "POST", trigger, body, "application/json")
        assert status == 200, data
    manual = "SELECT count(*) FROM job_runs WHERE trigger = 'manual'"
    assert await store.pool.fetchval(manual) == 1

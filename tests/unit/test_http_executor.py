"""The http executor bounds what it receives and keeps its secret headers at home.

A local aiohttp server (loopback only): a 300 MB body streamed to the
executor leaves this process's RSS where it was (only the tail is kept), and a
redirect to another origin is not followed, so the secret header never
reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from aiohttp import web

from actors.adapters.executors import OUTPUT_TAIL_BYTES, run_http
from actors.adapters.executors import http as http_executor
from actors.domain import ExecutionResult, HttpSpec, Outcome, RunContext

CTX = RunContext(
    run_id="3f1d3c57-1d0c-4d43-9a3e-2b4a3c7e9f10",
    job="hook",
    scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    attempt=1,
    fencing_token=1,
)
MB = 1024 * 1024
BODY_MB = 300
CHUNK = b"x" * MB
END = b"-the-last-line-of-the-body"
SECRET = "hook-secret-value-3b9c1e"
SECRET_VARIABLE = "CLAIMD_TEST_HOOK_SECRET"


@contextlib.asynccontextmanager
async def _serve(routes: list[web.RouteDef]) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _big(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.enable_chunked_encoding()
    await response.prepare(request)
    for _ in range(BODY_MB):
        await response.write(CHUNK)
    await response.write(END)
    await response.write_eof()
    return response


class _RSS:
    """The process's resident set, sampled while the body streams in: its peak."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self.before = self._process.memory_info().rss
        self.peak = self.before

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            await asyncio.sleep(0.02)


async def _run_measured(spec: HttpSpec) -> tuple[ExecutionResult, _RSS]:
    rss = _RSS()
    stop = asyncio.Event()
    watcher = asyncio.create_task(rss.watch(stop))
    try:
        result = await run_http(spec, CTX, timedelta(seconds=90))
    finally:
        stop.set()
        await watcher
    return result, rss


@pytest.mark.parametrize("whole", [False, True], ids=["capped", "cap-raised-whole-body-read"])
async def test_a_300_mb_body_leaves_the_rss_bounded(
    monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    if whole:  # every byte read: the tail alone is kept, whatever the size
        monkeypatch.setattr(http_executor, "HTTP_BODY_LIMIT", 1024 * MB)
    async with _serve([web.get("/big", _big)]) as base:
        result, rss = await _run_measured(HttpSpec(url=f"{base}/big", method="GET"))
        grew_mb = (rss.peak - rss.before) / MB
        print(f"RSS before {rss.before / MB:.1f} MB, peak {rss.peak / MB:.1f} MB (+{grew_mb:.1f})")
        assert grew_mb < 64, f"RSS grew by {grew_mb:.0f} MB for a {BODY_MB} MB body"
        tail = result.output_tail or ""
        assert len(tail) <= OUTPUT_TAIL_BYTES
        if whole:
            assert result.outcome is Outcome.SUCCEEDED, result
            assert tail.endswith(END.decode())
        else:
            assert result.outcome is Outcome.FAILED
            assert "response body over" in (result.error or "")


def _recorder(seen: list[dict[str, str]]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(text="landed")

    return handler


async def test_a_cross_origin_redirect_carries_no_secret_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)
    elsewhere: list[dict[str, str]] = []
    home: list[dict[str, str]] = []
    async with _serve([web.get("/landing", _recorder(elsewhere))]) as other:

        async def away(_: web.Request) -> web.Response:
            raise web.HTTPFound(f"{other}/landing")

        async def within(_: web.Request) -> web.Response:
            raise web.HTTPFound("/landing")

        routes = [web.get("/away", away), web.get("/within", within)]
        routes.append(web.get("/landing", _recorder(home)))
        async with _serve(routes) as base:
            spec = HttpSpec(
                url=f"{base}/away", method="GET", secret_headers={"X-Hook-Token": SECRET_VARIABLE}
            )
            result = await run_http(spec, CTX, timedelta(seconds=30))
            assert [h.get("X-Hook-Token") for h in elsewhere] == [], "the secret left its origin"
            assert elsewhere == []  # not followed at all
            assert result.outcome is Outcome.FAILED
            assert result.exit_code == 302
            assert "another origin" in (result.error or "")
            # Within the origin a redirect is followed, the secret header with it.
            spec = HttpSpec(
                url=f"{base}/within",
                method="GET",
                secret_headers={"X-Hook-Token": SECRET_VARIABLE},
            )
            result = await run_http(spec, CTX, timedelta(seconds=30))
            assert result.outcome is Outcome.SUCCEEDED, result
            assert [h.get("X-Hook-Token") for h in home] == [SECRET]

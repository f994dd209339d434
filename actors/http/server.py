"""HTTP: /metrics, /healthz, /readyz, the operator API (actors/http/api/) and a status page at /."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from actors.http.api import OperatorApi, answer_parser_errors_as_json, json_errors
from actors.http.api.reading import answer
from actors.http.openapi import BY_ID
from actors.observability import DELIVERIES_SKIPPED, FENCED_COMPLETIONS, REDELIVERIES, get_logger
from actors.observability.exposition import render_chunks
from actors.observability.memory import trim_heap

TRIM_AFTER_BYTES = 16 << 20  # a page this big leaves freed heap worth returning to the system
log = get_logger("http")

ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]

# The status page: HTML, CSS and JS shipped in the package (no CDN: it works
# offline). The page fetches /api/jobs, /api/grid and /api/status and renders
# them itself, so nothing from the data is ever interpolated into HTML here.
STATIC = Path(__file__).with_name("static")
# Only the page's own files may run or load; a job's name, error or output that
# slipped into markup could not execute (the page builds DOM with textContent).
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def _samples(metric: Collector, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``metric`` named ``name``, whatever its labels.

    Read from the metric itself, not the registry: a registry-wide collect
    would build every per-job series (hundreds of thousands with 10,000 jobs)
    on the event loop for three numbers.
    """
    return [
        (dict(s.labels), s.value)
        for family in metric.collect()
        for s in family.samples
        if s.name == name
    ]


def counters() -> dict[str, Any]:
    """What this replica counted since it started: duplicates skipped, completions fenced."""
    skipped = _samples(DELIVERIES_SKIPPED, "claimd_deliveries_skipped_total")
    by_reason: dict[str, float] = {}
    for labels, value in skipped:
        reason = labels.get("reason", "")
        by_reason[reason] = by_reason.get(reason, 0.0) + value
    fenced = _samples(FENCED_COMPLETIONS, "claimd_fenced_completions_total")
    return {
        "deliveries_skipped": sum(v for _, v in skipped),
        "deliveries_skipped_by_reason": by_reason,
        "fenced_completions": sum(v for _, v in fenced),
        "redeliveries": sum(v for _, v in _samples(REDELIVERIES, "claimd_redeliveries_total")),
    }


async def _config_rollout(api: OperatorApi | None) -> dict[str, Any] | None:
    """The config generations and the replicas' files; None while it cannot say."""
    if api is None:
        return None
    try:
        return await api.service.config_rollout()
    except Exception as exc:  # noqa: BLE001 - the status answers whatever the database does
        log.debug("status: config generations unknown", error=repr(exc))
        return None


async def _rejected_jobs(api: OperatorApi | None) -> list[dict[str, Any]] | None:
    """The jobs the config file rejected (the operator's record); None while it cannot say."""
    if api is None:
        return None
    try:
        return await api.service.rejected_jobs()
    except Exception as exc:  # noqa: BLE001 - the status answers whatever the database does
        log.debug("status: rejected jobs unknown", error=repr(exc))
        return None


async def status_page(_: web.Request) -> web.FileResponse:
    """The status page (its data comes from the JSON API, fetched by the page)."""
    return web.FileResponse(
        STATIC / "index.html",
        headers={
            "Cache-Control": "no-cache",
            "Content-Type": "text/html; charset=utf-8",
            "Content-Security-Policy": PAGE_POLICY,
        },
    )


# The page's own files, by name: nothing else under /static/ is ever served.
ASSETS = frozenset(p.name for p in STATIC.iterdir() if p.suffix in (".css", ".js", ".html"))


async def static_file(request: web.Request) -> web.FileResponse:
    """One of the page's files; a replica upgraded in place serves new ones, so revalidated."""
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})


async def stream_metrics(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    """The /metrics page, rendered off the event loop a chunk at a time and sent as made.

    With thousands of jobs the text is tens of MB and seconds of Python, which
    would hold up every actor on the loop; each chunk is sent before the next is
    made, so the page is never held whole (chunked transfer, no Content-Length).
    """
    chunks = render_chunks()
    response = web.StreamResponse(headers=headers)
    sent = 0
    try:
        await response.prepare(request)
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            sent += len(chunk)
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        # The scraper gave up (its timeout) or went away: nothing to report.
        log.debug("metrics scrape: client went away mid-response")
    finally:
        chunks.close()
        if sent >= TRIM_AFTER_BYTES:
            # The page's chunks were freed into the heap: give them back.
            await asyncio.to_thread(trim_heap)
    return response


def build_app(
    ready: ReadyCheck,
    jobs_summary: Callable[[], Awaitable[list[dict[str, Any]]]],
    api: OperatorApi | None = None,
    *,
    refresh: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """The replica's HTTP surface; with ``api``, the operator API and /openapi.json too.

    ``refresh`` runs before each /metrics render (the cluster gauges; it must not raise).
    """

    async def metrics(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": CONTENT_TYPE_LATEST}
        if request.method == "HEAD":  # a streamed body is not held back for HEAD
            return web.Response(headers=headers)
        if refresh is not None:
            await refresh()
        return await stream_metrics(request, headers)

    async def healthz(_: web.Request) -> web.Response:
        return answer(BY_ID["healthz"].answer, {"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        checks = await ready()
        # "degraded: ...": the server answers reads and refuses writes (read-only,
        # stream full). Ready (200) for what reads serve, and said.
        degraded = [v for v in checks.values() if v.startswith("degraded:")]
        ok = all(v == "ok" or v.startswith("degraded:") for v in checks.values())
        status = ("degraded" if degraded else "ok") if ok else "unavailable"
        return answer(
            BY_ID["readyz"].answer, {"status": status, "checks": checks}, 200 if ok else 503
        )

    async def jobs(_: web.Request) -> web.Response:
        try:
            rows = await jobs_summary()
        except Exception as exc:  # noqa: BLE001 - the database is away: say so, do not 500
            return web.json_response({"error": f"unavailable: {type(exc).__name__}"}, status=503)
        return web.json_response(rows)

    async def status_json(_: web.Request) -> web.Response:
        checks, config_rejected, config = await asyncio.gather(
            ready(), _rejected_jobs(api), _config_rollout(api)
        )
        return answer(
            BY_ID["getStatus"].answer,
            {
                "checks": checks,
                "counters": counters(),
                "config_rejected": config_rejected,
                "config": config,
            },
        )

    # Every failure of every route, the status page's files included, as JSON.
    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if api is None:
        app.router.add_get("/api/jobs", jobs)
    else:
        api.add_routes(app)  # /api/jobs with more fields, the same ones included
    app.router.add_get("/api/status", status_json, allow_head=False)
    app.router.add_get("/", status_page)
    app.router.add_get("/static/{name}", static_file)
    return app


class PortUnavailable(OSError):
    """The HTTP port cannot be listened on; the message says why and what to change."""


def listen_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, say), or None if it can.

    Checked as the server binds (SO_REUSEADDR, every address of the host), so
    a port held by another process is found before anything else starts.
    """
    if port <= 0:
        return None  # 0: any free port; -1: off
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return f"{host} is not an address of this host ({exc.strerror})"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                return _why(host, port, exc)
    return None


def _why(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner and the bound port (port 0 picks one).

    PortUnavailable when the port is taken (or not this host's).
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    answer_parser_errors_as_json(runner)
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise PortUnavailable(
            exc.errno,
            f'{_why(host, port, exc)}; set another http = "HOST:PORT" in [claimd] '
            "(or CLAIMD_HTTP; port 0 picks a free one)",
        ) from None
    # aiohttp has no public accessor for the bound port (needed when port is 0).
    sockets: Any = getattr(site._server, "sockets", None)
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound

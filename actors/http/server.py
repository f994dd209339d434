"""HTTP: /metrics, /healthz, /readyz, the operator API (actors/http/api/) and a status page at /."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from actors.clocks import Stopwatch
from actors.http.api import OperatorApi, answer_parser_errors_as_json, json_errors
from actors.http.api.reading import answer
from actors.http.guard import Guard, Tokens, connection_cap, safe_headers
from actors.http.openapi import BY_ID
from actors.observability import DELIVERIES_SKIPPED, FENCED_COMPLETIONS, REDELIVERIES, get_logger
from actors.observability.exposition import render_chunks
from actors.observability.memory import trim_heap
from actors.operator.models import ConfigRollout, RejectedJob

TRIM_AFTER_BYTES = 16 << 20  # a page this big leaves freed heap worth returning to the system
log = get_logger("http")

ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]
T = TypeVar("T")

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


async def _unless_unknown(
    api: OperatorApi | None, what: str, read: Callable[[OperatorApi], Awaitable[T]]
) -> T | None:
    """What ``read`` answers; None while it cannot say (no operator API, or the database
    does not answer: the status answers whatever the database does)."""
    if api is None:
        return None
    try:
        return await read(api)
    except Exception as exc:  # noqa: BLE001 - a status page of what is known
        log.debug(f"status: {what} unknown", error=repr(exc))
        return None


def _config_rollout(api: OperatorApi | None) -> Awaitable[ConfigRollout | None]:
    """The config generations and the replicas' files."""
    return _unless_unknown(api, "config generations", lambda a: a.service.config_rollout())


def _rejected_jobs(api: OperatorApi | None) -> Awaitable[list[RejectedJob] | None]:
    """The jobs the config file rejected (the operator's record)."""
    return _unless_unknown(api, "rejected jobs", lambda a: a.service.rejected_jobs())


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


METRICS_MAX_AGE_S = 1.0
LINGER_S = 1.0  # a page is rendered at most once a second, whoever scrapes


class _Render:
    """One rendering of the page: its chunks as they are made, read by every scrape."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False
        self.error: BaseException | None = None
        self.age = Stopwatch()
        self._more = asyncio.Event()

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self._wake()

    def finish(self, error: BaseException | None) -> None:
        self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        more, self._more = self._more, asyncio.Event()
        more.set()

    async def read(self) -> AsyncIterator[bytes]:
        """Each chunk, as soon as it is made."""
        sent = 0
        while True:
            if sent < len(self.chunks):
                sent += 1
                yield self.chunks[sent - 1]
            elif self.done:
                if self.error is not None:
                    raise RuntimeError("the metrics page failed to render") from self.error
                return
            else:
                await self._more.wait()


class MetricsPage:
    """The /metrics page, rendered off the event loop at most once every ``max_age`` seconds.

    With thousands of jobs the text is MBs and a second or more of CPU: each
    scrape rendering its own would let a few clients (or one hostile one) keep
    a core busy. A scrape during a render, or within ``max_age`` of its start,
    reads that render; the first is sent each chunk as it is made (the page is
    not held whole before it is sent), and the page is dropped ``max_age``
    after it was made. ``refresh`` (the cluster gauges) runs before each
    render and must not raise.
    """

    def __init__(
        self,
        refresh: Callable[[], Awaitable[None]] | None = None,
        max_age: float = METRICS_MAX_AGE_S,
    ) -> None:
        self.refresh = refresh
        self.max_age = max_age
        self.renders = 0
        self._render: _Render | None = None
        self._task: asyncio.Task[None] | None = None

    def current(self) -> _Render:
        """The render a scrape now reads: the running one, a fresh one, or a new one."""
        render = self._render
        # Its age counts from its start: a render slowed by the probes of refresh (a
        # server that does not answer) is not then served for another second.
        if render is None or (render.done and render.age.seconds() >= self.max_age):
            render = self._render = _Render()
            self.renders += 1
            self._task = asyncio.create_task(self._make(render))
        return render

    async def _make(self, render: _Render) -> None:
        error: BaseException | None = None
        chunks = render_chunks()
        try:
            if self.refresh is not None:
                await self.refresh()
            while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                render.add(chunk)
        except Exception as exc:  # every scrape reading it answers 500
            log.exception("metrics: the page failed to render")
            error = exc
        finally:
            chunks.close()
            render.finish(error)
        await asyncio.sleep(self.max_age)
        if self._render is render:
            self._render = None
        if sum(map(len, render.chunks)) >= TRIM_AFTER_BYTES:
            render.chunks.clear()
            # The page's chunks were freed into the heap: give them back.
            await asyncio.to_thread(trim_heap)


METRICS_PAGE = web.AppKey("claimd.metrics_page", MetricsPage)


async def stream_metrics(
    request: web.Request, headers: dict[str, str], page: MetricsPage
) -> web.StreamResponse:
    """The /metrics page, sent a chunk at a time (chunked transfer, no Content-Length)."""
    render = page.current()
    response = web.StreamResponse(headers=headers)
    try:
        await response.prepare(request)
        async for chunk in render.read():
            await response.write(chunk)
        await response.write_eof()
    except ConnectionError:
        # The scraper gave up (its timeout) or went away: nothing to report.
        log.debug("metrics scrape: client went away mid-response")
    return response


def build_app(
    ready: ReadyCheck,
    api: OperatorApi | None = None,
    *,
    refresh: Callable[[], Awaitable[None]] | None = None,
    guard: Guard | None = None,
) -> web.Application:
    """The replica's HTTP surface; with ``api``, the operator API and /openapi.json too.

    ``refresh`` runs before each /metrics render (the cluster gauges; it must not raise).
    ``guard``: the Host allow-list and the tokens (default: the API's tokens, loopback
    names only).
    """
    if guard is None:
        guard = Guard(
            tokens=api.tokens if api is not None else Tokens(),
            metrics_token=api.metrics_token if api is not None else False,
        )
    page = MetricsPage(refresh)

    async def metrics(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": CONTENT_TYPE_LATEST}
        if request.method == "HEAD":  # a streamed body is not held back for HEAD
            return web.Response(headers=headers)
        return await stream_metrics(request, headers, page)

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

    # Every failure of every route, the status page's files included, as JSON; the
    # guard (Host, token) inside it, so that its refusals are JSON too.
    app = web.Application(middlewares=[json_errors, guard.middleware()])
    app.on_response_prepare.append(safe_headers)
    app[METRICS_PAGE] = page
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if api is not None:
        api.add_routes(app)
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


async def serve(
    app: web.Application, host: str, port: int, guard: Guard | None = None
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner and the bound port (port 0 picks one).

    With ``guard``: at most its connection cap held at once (a quarter of the
    file limit at most), a request's headers within its header timeout (aiohttp
    closes a connection that has sent no whole request by then, and an idle one
    as long after its last answer). PortUnavailable when the port is taken (or
    not this host's).
    """
    guard = guard or Guard()
    # An unread rest of a body (a 401 before it was read, a body past its timeout) is
    # read and dropped for LINGER_S at most, not aiohttp's 10 s, before the close.
    runner = web.AppRunner(
        app, access_log=None, keepalive_timeout=guard.header_timeout_s, lingering_time=LINGER_S
    )
    await runner.setup()
    answer_parser_errors_as_json(runner, connection_cap(guard.max_connections))
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

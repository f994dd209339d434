"""HTTP: /metrics, /healthz, /readyz, the operator API (actors/api.py) and a status page at /."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from actors.api import OperatorApi

ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]


def build_app(ready: ReadyCheck, jobs_summary: Callable[[], Awaitable[list[dict[str, Any]]]],
              api: OperatorApi | None = None) -> web.Application:
    """The replica's HTTP surface; with ``api``, the operator API and /openapi.json too."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        checks = await ready()
        ok = all(v == "ok" for v in checks.values())
        return web.json_response({"status": "ok" if ok else "unavailable", "checks": checks},
                                 status=200 if ok else 503)

    async def jobs(_: web.Request) -> web.Response:
        return web.json_response(await jobs_summary())

    async def status(_: web.Request) -> web.Response:
        """A page an operator can open: each job, its backlog and last success."""
        rows = await jobs_summary()
        checks = await ready()
        body = "".join(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
                html.escape(str(r["name"])),
                "paused" if r["paused"] else ("enabled" if r["enabled"] else "removed"),
                html.escape(str(r["pending"])), html.escape(str(r["last_success"] or "never")))
            for r in rows)
        health = ", ".join(f"{html.escape(k)}: {html.escape(str(v))}"
                           for k, v in checks.items())
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>claimd</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:.3em 1em;"
            "text-align:left;border-bottom:1px solid #ddd}</style></head><body>"
            f"<h1>claimd</h1><p>{health}</p><table><tr><th>job</th><th>state</th>"
            f"<th>pending runs</th><th>last success</th></tr>{body}</table>"
            "<p><a href='/metrics'>metrics</a> · <a href='/api/jobs'>/api/jobs</a></p>"
            "</body></html>")
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if api is None:
        app.router.add_get("/api/jobs", jobs)
    else:
        api.add_routes(app)  # /api/jobs with more fields, the same ones included
    app.router.add_get("/", status)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner and the bound port (port 0 picks one)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    # aiohttp has no public accessor for the bound port (needed when port is 0).
    sockets: Any = getattr(site._server, "sockets", None)
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound

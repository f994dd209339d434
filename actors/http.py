"""HTTP: /metrics, /healthz, /readyz and a small read-only JSON API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]


def build_app(ready: ReadyCheck, jobs_summary: Callable[[], Awaitable[list[dict[str, Any]]]]
              ) -> web.Application:
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

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/jobs", jobs)
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

"""Every failure of every route as JSON ``{"error": "..."}`` with the right status.

Two places answer errors: the ``json_errors`` middleware, for whatever a
route (or aiohttp's routing: 404, 405, 413) raises, and the protocol handler,
for bytes aiohttp's HTTP parser refuses before any route is chosen (a raw
invalid byte in the request line, a line over 8190 bytes). A 500 is JSON
too, and logged once with its traceback; a 4xx is the client's problem and
logged at debug level only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from actors.http.guard import SAFE_HEADERS, SERVER_NAME
from actors.observability import HTTP_REFUSED, get_logger
from actors.operator import OperatorError, Unauthorized
from actors.ports import StoreUnavailable

log = get_logger("http")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The store is away (the operator's port says so, whatever its driver), which
# is a 503, not a bug.
OUTAGES = (OSError, TimeoutError, StoreUnavailable)
INTERNAL = "internal error (the replica's log has it, with its traceback)"


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _routing_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no route, wrong method, body too large) in our words."""
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    if exc.status == 404:
        message = "nothing here (the API's routes are listed at /openapi.json)"
    elif exc.status == 405:
        message = f"{request.method} is not allowed here; allowed: {headers.get('Allow', '')}"
    else:  # 413 says the limit; the others their reason
        text = exc.text or ""
        message = exc.reason if not text or text.startswith(f"{exc.status}:") else text
    return error_response(exc.status, message, headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of a route as JSON with a message; never a text/plain 500."""
    try:
        return await handler(request)
    except OperatorError as exc:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return error_response(exc.status, str(exc), headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _routing_error(request, exc)
    except OUTAGES as exc:
        log.warning("api: database unavailable", path=request.path, error=repr(exc))
        return error_response(503, "the database is unavailable; try again")
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("http: unexpected error", method=request.method, path=request.path)
        return error_response(500, INTERNAL)


class JsonErrorHandler(RequestHandler):
    """aiohttp's protocol handler, answering what its parser refuses as JSON."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # an answer has begun: the connection is closed
            raise ConnectionError("an answer was already being sent; the connection is closed")
        if status >= 500:
            log.error("http: unexpected error", error=repr(exc), exc_info=exc)
            text = INTERNAL
        else:
            first = (message or HTTPStatus(status).phrase).splitlines()[0]
            text = f"malformed HTTP request: {first.split(': ')[0].rstrip(':')}"
            log.debug("http: malformed request", status=status, error=text)
        response = error_response(status, text, {**SAFE_HEADERS, "Server": SERVER_NAME})
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    """A low-level server whose connections answer parser errors as JSON, at most
    ``cap`` of them at once.

    Past the cap, the oldest connection not in the middle of a request (still
    sending its headers, or idle between requests) is closed for the new one,
    else the new one is: the file descriptors a replica needs for its database,
    NATS and its jobs' pipes stay free whatever clients do, and a slow or idle
    client cannot keep a health check out.
    """

    cap = 0  # 0: no cap (set per instance by answer_parser_errors_as_json)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if not self.cap:
            return
        # Oldest first; a closed one stays listed until its handler's task ends.
        held = [(h, t) for h, t in self._connections.items() if not t.is_closing()]
        excess = len(held) - self.cap
        if excess <= 0:
            return
        for old, old_transport in held:
            # aiohttp's handler says whether a request is being handled (no public name).
            if excess > 0 and not getattr(old, "_request_in_progress", True):
                old_transport.close()
                HTTP_REFUSED.labels(reason="connection_cap").inc()
                excess -= 1
        if excess > 0:  # every one is busy answering: the new one waits its turn elsewhere
            transport.close()
            HTTP_REFUSED.labels(reason="connection_cap").inc()
        log.debug("http: connection cap reached", cap=self.cap)

    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        # aiohttp has no hook for the parser's answers; the subclass adds no state.
        handler.__class__ = JsonErrorHandler
        return handler


def answer_parser_errors_as_json(runner: web.AppRunner, cap: int = 0) -> None:
    """Make ``runner``'s server (after setup, before a site starts) answer malformed requests
    as JSON too, and hold at most ``cap`` connections (0: no cap)."""
    server = runner.server
    assert server is not None, "call after runner.setup()"
    server.__class__ = JsonErrorServer
    cast(JsonErrorServer, server).cap = cap

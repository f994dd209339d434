"""The operator's HTTP API: reads for anyone who can reach the port, actions for a token.

Actions (trigger, pause, resume, cancel, backfill) need ``Authorization:
Bearer <token>`` matching a token named in the settings, compared in constant
time and never logged. Without a configured token the API is read-only:
actions answer 403. A missing or wrong token answers 401. Every error is JSON
``{"error": "..."}``; bad input is 400, 404 or 422, never 500. The contract is
``/openapi.json`` (actors/openapi.py), checked against a live replica by
schemathesis in the tests.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from actors.domain.backfill import BACKFILL_MAX_RUNS
from actors.observability import get_logger
from actors.openapi import document
from actors.operator import (
    BadInput,
    Forbidden,
    OperatorError,
    OperatorService,
    Unauthorized,
)
from actors.operator.grid import MAX_GRID
from actors.ports import Actor, StoreUnavailable

log = get_logger("api")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The store is away (the operator's port says so, whatever its driver), which
# is a 503, not a bug.
_OUTAGES = (OSError, TimeoutError, StoreUnavailable)


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure of an API route as JSON with a message."""
    try:
        return await handler(request)
    except OperatorError as exc:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return error_response(exc.status, str(exc), headers)
    except web.HTTPException as exc:
        if not request.path.startswith("/api/") or exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(exc.status, exc.reason, headers)
    except _OUTAGES as exc:
        log.warning("api: database unavailable", path=request.path, error=repr(exc))
        return error_response(503, "the database is unavailable; try again")


def _int(
    request: web.Request, name: str, default: int | None, low: int = 0, high: int = 2**63 - 1
) -> int | None:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"{name} must be a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise BadInput(f"{name} must be between {low} and {high}, got {value}")
    return value


def _states(request: web.Request) -> list[str]:
    states = [s.strip() for value in request.query.getall("state", []) for s in value.split(",")]
    if any(not s for s in states):
        raise BadInput("state must name a state, e.g. state=failed or state=failed,skipped")
    return states


def _optional(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    if value is not None and not value.strip():
        raise BadInput(f"query parameter {name!r} must not be empty")
    return value


def _flag(request: web.Request, name: str) -> bool:
    text = request.query.get(name)
    if text is None:
        return False
    if text not in ("true", "false"):
        raise BadInput(f"{name} must be true or false, got {text!r}")
    return text == "true"


def _required(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None or not value.strip():
        raise BadInput(f"query parameter {name!r} is required")
    return value


async def _body(
    request: web.Request,
    allowed: Sequence[str],
    required: Sequence[str] = (),
    integers: Sequence[str] = (),
) -> dict[str, Any]:
    """A JSON object body of string values (``integers`` apart); empty means ``{}``."""
    raw = await request.read()
    if not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadInput("the body is not JSON") from None
    if not isinstance(data, dict):
        raise BadInput("the body must be a JSON object")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise BadInput(f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
    for key, value in data.items():
        if key in integers:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
                raise BadInput(f"field {key!r} must be a positive whole number")
        elif not isinstance(value, str):
            raise BadInput(f"field {key!r} must be a string")
    missing = [k for k in required if not data.get(k, "").strip()]
    if missing:
        raise BadInput(f"field {missing[0]!r} is required")
    return data


class OperatorApi:
    """Routes over an :class:`OperatorService`; ``tokens`` are (name, token) pairs."""

    def __init__(self, service: OperatorService, tokens: Sequence[tuple[str, str]]) -> None:
        self.service = service
        self._tokens = [(name, token.encode()) for name, token in tokens]

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(json_errors)
        get, post = app.router.add_get, app.router.add_post
        get("/openapi.json", self.openapi, allow_head=False)
        get("/api/jobs", self.jobs, allow_head=False)
        get("/api/jobs/{name}", self.job, allow_head=False)
        get("/api/jobs/{name}/audit", self.audit, allow_head=False)
        get("/api/runs", self.runs, allow_head=False)
        get("/api/runs/{run_id}", self.run, allow_head=False)
        get("/api/actions", self.actions, allow_head=False)
        get("/api/grid", self.grid, allow_head=False)
        get("/api/config/rejected", self.rejected_jobs, allow_head=False)
        post("/api/jobs/{name}/pause", self.pause)
        post("/api/jobs/{name}/resume", self.resume)
        post("/api/jobs/{name}/trigger", self.trigger)
        post("/api/jobs/{name}/backfill", self.backfill)
        post("/api/runs/{run_id}/cancel", self.cancel)

    def _actor(self, request: web.Request) -> Actor:
        """Who may act: the name of the token presented. Raises 403 / 401."""
        if not self._tokens:
            raise Forbidden(
                "this API is read-only: no api_token_file or api_token_env is "
                "configured in [claimd]"
            )
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("this action needs 'Authorization: Bearer <token>'")
        presented = given.strip().encode()
        name = None
        for candidate, token in self._tokens:  # every token compared: no early exit
            if hmac.compare_digest(presented, token):
                name = candidate
        if name is None:
            raise Unauthorized("the bearer token is not one this replica accepts")
        origin = request.remote or "unknown"
        claimed = request.headers.get("Claimd-Actor", "").strip()[:100]
        return Actor(name=name, via="http", origin=f"{origin} for {claimed}" if claimed else origin)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(document())

    async def jobs(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.jobs())

    async def rejected_jobs(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.rejected_jobs())

    async def job(self, request: web.Request) -> web.Response:
        recent = _int(request, "recent", 20, high=1000)
        assert recent is not None
        return web.json_response(await self.service.job(request.match_info["name"], recent=recent))

    async def audit(self, request: web.Request) -> web.Response:
        return web.json_response(
            await self.service.audit(
                request.match_info["name"], _required(request, "from"), _required(request, "to")
            )
        )

    async def runs(self, request: web.Request) -> web.Response:
        limit = _int(request, "limit", 50, low=1, high=1000)
        assert limit is not None
        return web.json_response(
            await self.service.runs(
                job=_optional(request, "job"),
                states=_states(request),
                since=_optional(request, "since"),
                until=_optional(request, "until"),
                limit=limit,
                cursor=_optional(request, "cursor"),
                ahead=_flag(request, "ahead"),
            )
        )

    async def run(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.run(request.match_info["run_id"]))

    async def grid(self, request: web.Request) -> web.Response:
        instants = _int(request, "instants", 30, low=1, high=MAX_GRID)
        assert instants is not None
        return web.json_response(await self.service.grid(instants, job=_optional(request, "job")))

    async def actions(self, request: web.Request) -> web.Response:
        limit = _int(request, "limit", 50, low=1, high=1000)
        assert limit is not None
        return web.json_response(
            await self.service.actions(
                job=_optional(request, "job"),
                limit=limit,
                before=_int(request, "before", None, low=1),
            )
        )

    @staticmethod
    def _done(result: dict[str, Any]) -> web.Response:
        log.info(
            "operator action",
            action=result["action"],
            job=result["job"],
            run_id=result["run_id"],
            actor=result["actor"],
            via="http",
        )
        return web.json_response(result)

    async def pause(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        return self._done(await self.service.pause(actor, request.match_info["name"]))

    async def resume(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        body = await _body(request, ["paused_instants"])
        return self._done(
            await self.service.resume(
                actor, request.match_info["name"], body.get("paused_instants") or None
            )
        )

    async def trigger(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        body = await _body(request, ["at"])
        return self._done(
            await self.service.trigger(actor, request.match_info["name"], body.get("at") or None)
        )

    async def backfill(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        body = await _body(
            request, ["from", "to", "max_runs"], required=["from", "to"], integers=["max_runs"]
        )
        return self._done(
            await self.service.backfill(
                actor,
                request.match_info["name"],
                body["from"],
                body["to"],
                max_runs=body.get("max_runs", BACKFILL_MAX_RUNS),
            )
        )

    async def cancel(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        return self._done(await self.service.cancel(actor, request.match_info["run_id"]))


__all__ = ["OperatorApi", "error_response", "json_errors"]

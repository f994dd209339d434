"""The operator's routes: reads for a read token, actions for an operate token.

Actions (trigger, pause, resume, cancel, backfill) need ``Authorization:
Bearer <token>`` matching a token of scope operate named in the settings
(actors/http/guard.py compares it and checks each read's token too); a read
token answers 403. Without a configured token the reads are open and the API
read-only: actions answer 403. A missing or wrong token answers 401 (before
anything else of the request is read). Each request is read through its operation's models
(actors/http/openapi) and each answer sent through its model, so the server and
/openapi.json say the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from aiohttp import web

from actors.http.api.live import MAX_STREAMS, add_output_stream
from actors.http.api.notifications import NotificationReader, list_notifications
from actors.http.api.reading import answer, body_of, path_of, query_of
from actors.http.guard import Tokens
from actors.http.openapi import BY_ID, Scope, document
from actors.http.openapi import requests as rq
from actors.observability import get_logger
from actors.operator import OperatorService
from actors.ports import Caller, OutputFeed

log = get_logger("api")


def _ok(operation_id: str, data: Any) -> web.Response:
    return answer(BY_ID[operation_id].answer, data)


def _printable(text: str, limit: int) -> str:
    """A header's text as it may be recorded: printable characters only (no NUL, no
    undecodable byte), at most ``limit`` of them."""
    return "".join(c if c.isprintable() else "?" for c in text.strip()[:limit])


class OperatorApi:
    """Routes over an :class:`OperatorService`; ``tokens`` are (name, token[, scope]) entries
    (scope operate when not given)."""

    def __init__(
        self,
        service: OperatorService,
        tokens: Iterable[Sequence[str]] = (),
        *,
        metrics_token: bool = False,
    ) -> None:
        self.service = service
        self.tokens = Tokens(tokens)
        self.metrics_token = metrics_token
        # Where runs' live output is followed (set by the replica; None: kept tails only).
        self.output_feed: OutputFeed | None = None
        self.max_output_streams = MAX_STREAMS  # the replica bounds it by its connection cap
        # The notification outbox, once the database is connected (None: a 503).
        self.outbox: NotificationReader | None = None

    def add_routes(self, app: web.Application) -> None:
        """The API's operations of the table (actors/http/server adds the replica's own)."""
        handlers = {
            "openapi": self.openapi,
            "listJobs": self.jobs,
            "listRejectedJobs": self.rejected_jobs,
            "getConfig": self.config,
            "getJob": self.job,
            "auditJob": self.audit,
            "listRuns": self.runs,
            "getRun": self.run,
            "getGrid": self.grid,
            "listActions": self.actions,
            "listNotifications": self.notifications,
            "pauseJob": self.pause,
            "resumeJob": self.resume,
            "triggerJob": self.trigger,
            "backfillJob": self.backfill,
            "cancelRun": self.cancel,
        }
        for operation_id, handler in handlers.items():
            op = BY_ID[operation_id]
            app.router.add_route(op.method.upper(), op.path, handler)
        add_output_stream(app, self, BY_ID["streamRunOutput"].path)  # actors/http/api/live.py

    def _actor(self, request: web.Request) -> Caller:
        """Who may act: the name of the operate token presented. Raises 403 / 401."""
        who = self.tokens.authorize(request, Scope.OPERATE)
        assert who is not None  # an operate scope is never open
        name = who[0]
        origin = request.remote or "unknown"
        claimed = _printable(request.headers.get("Claimd-Actor", ""), 100)
        return Caller(
            name=name, via="http", origin=f"{origin} for {claimed}" if claimed else origin
        )

    # --- reads ----------------------------------------------------------------------

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(document(self.tokens.configured, self.metrics_token))

    async def jobs(self, request: web.Request) -> web.Response:
        return _ok("listJobs", await self.service.jobs())

    async def rejected_jobs(self, request: web.Request) -> web.Response:
        return _ok("listRejectedJobs", await self.service.rejected_jobs())

    async def config(self, request: web.Request) -> web.Response:
        return _ok("getConfig", await self.service.config_rollout())

    async def job(self, request: web.Request) -> web.Response:
        name = path_of(request, rq.JobPath).name
        query = query_of(request, rq.JobQuery)
        return _ok("getJob", await self.service.job(name, recent=query.recent))

    async def audit(self, request: web.Request) -> web.Response:
        name = path_of(request, rq.JobPath).name
        query = query_of(request, rq.AuditQuery)
        return _ok("auditJob", await self.service.audit(name, query.start, query.end))

    async def runs(self, request: web.Request) -> web.Response:
        query = query_of(request, rq.RunsQuery)
        states = [s for value in query.state for s in value.split(",")]
        page = await self.service.runs(
            job=query.job,
            states=states,
            since=query.since,
            until=query.until,
            limit=query.limit,
            cursor=query.cursor,
            ahead=query.ahead,
        )
        return _ok("listRuns", page)

    async def run(self, request: web.Request) -> web.Response:
        run_id = path_of(request, rq.RunPath).run_id
        return _ok("getRun", await self.service.run(run_id))

    async def grid(self, request: web.Request) -> web.Response:
        query = query_of(request, rq.GridQuery)
        return _ok("getGrid", await self.service.grid(query.instants, job=query.job))

    async def actions(self, request: web.Request) -> web.Response:
        query = query_of(request, rq.ActionsQuery)
        found = await self.service.actions(job=query.job, limit=query.limit, before=query.before)
        return _ok("listActions", found)

    async def notifications(self, request: web.Request) -> web.Response:
        return await list_notifications(request, self.outbox)

    # --- actions --------------------------------------------------------------------

    @staticmethod
    def _done(operation_id: str, result: dict[str, Any]) -> web.Response:
        log.info(
            "operator action",
            action=result["action"],
            job=result["job"],
            run_id=result["run_id"],
            actor=result["actor"],
            via="http",
        )
        return _ok(operation_id, result)

    async def pause(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        name = path_of(request, rq.JobPath).name
        return self._done("pauseJob", await self.service.pause(actor, name))

    async def resume(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        name = path_of(request, rq.JobPath).name
        body = await body_of(request, rq.ResumeBody)
        return self._done("resumeJob", await self.service.resume(actor, name, body.paused_instants))

    async def trigger(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        name = path_of(request, rq.JobPath).name
        body = await body_of(request, rq.TriggerBody)
        done = await self.service.trigger(actor, name, body.at, body.overlap)
        return self._done("triggerJob", done)

    async def backfill(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        name = path_of(request, rq.JobPath).name
        body = await body_of(request, rq.BackfillBody, required=True)
        done = await self.service.backfill(
            actor, name, body.start, body.end, max_runs=body.max_runs, overlap=body.overlap
        )
        return self._done("backfillJob", done)

    async def cancel(self, request: web.Request) -> web.Response:
        actor = self._actor(request)
        run_id = path_of(request, rq.RunPath).run_id
        return self._done("cancelRun", await self.service.cancel(actor, run_id))

"""Every route of the HTTP surface, declared once: its models, its answers, its links.

The server adds its routes from this table (actors/http/api, actors/http/server) and the
document's paths are built from it (actors/http/openapi/document.py); what pydantic
cannot say -- statuses, security, links -- is said here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel

from actors.http.openapi import notifications as nt
from actors.http.openapi import requests as rq
from actors.http.openapi import responses as rs

# What each error status means; the document lists, per operation, the ones it can answer.
ERRORS = {
    400: "the request does not match this document (the message names the parameter or field)",
    401: "missing or wrong bearer token",
    403: "the token's scope does not allow this (a read token), or read-only: no token is "
    "configured",
    404: "no such job or run",
    408: "the body did not arrive within the body timeout",
    409: "nothing to do",
    415: "the body is not application/json",
    422: "well formed, and impossible: a reversed or too large range, a future trigger",
    503: "the database is unavailable",
}
# 401 and 403 are added from each operation's scope (see Operation.statuses).
READ_ERRORS = (400, 404, 422, 503)
ACTION_ERRORS = (400, 404, 409, 422, 503)


class Scope(StrEnum):
    """What a request must present: nothing, a read token, or an operate token.

    Operate implies read. Without any token configured the reads are open and
    the actions refused (403, read-only); /metrics is open unless the setting
    ``metrics_token`` asks for a read token.
    """

    OPEN = "open"
    READ = "read"
    OPERATE = "operate"


@dataclass(frozen=True)
class Link:
    """An OpenAPI link: a value of this answer that another operation takes."""

    operation_id: str
    parameter: str  # "name" or "query.cursor" (location-qualified where not the path)
    expression: str


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: Literal["get", "post"]
    path: str
    summary: str
    answer: type[BaseModel]
    path_params: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    body_required: bool = False
    errors: tuple[int, ...] = ()
    scope: Scope = Scope.READ
    description: str | None = None
    links: tuple[Link, ...] = ()
    media_type: str = "application/json"
    other: dict[int, tuple[str, type[BaseModel]]] = field(default_factory=dict)

    def statuses(self, protected: bool) -> tuple[int, ...]:
        """Its error statuses, with what its scope adds: a read 401 (when tokens are
        configured), an action 401 and 403."""
        added: tuple[int, ...] = ()
        if self.scope is Scope.OPERATE:
            added = (401, 403)
        elif self.scope is Scope.READ and protected:
            added = (401,)
        return tuple(sorted({*self.errors, *added}))


def _to(expression: str, parameter: str, *operation_ids: str) -> tuple[Link, ...]:
    return tuple(Link(op, parameter, expression) for op in operation_ids)


_JOB_USES = ("getJob", "auditJob", "pauseJob", "resumeJob", "triggerJob", "backfillJob")
_RUN_USES = ("getRun", "cancelRun")

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "listJobs",
        "get",
        "/api/jobs",
        "Every job: schedule, next fire, backlog, last outcome",
        rs.Jobs,
        errors=(503,),
        links=_to("$response.body#/0/name", "name", *_JOB_USES),
    ),
    Operation(
        "getJob",
        "get",
        "/api/jobs/{name}",
        "One job and its most recent runs",
        rs.JobDetail,
        path_params=rq.JobPath,
        query=rq.JobQuery,
        errors=READ_ERRORS,
        links=_to("$response.body#/recent_runs/0/id", "run_id", *_RUN_USES),
    ),
    Operation(
        "auditJob",
        "get",
        "/api/jobs/{name}/audit",
        "Each due instant in a range with its run, or why it has none",
        rs.Audit,
        path_params=rq.JobPath,
        query=rq.AuditQuery,
        errors=READ_ERRORS,
    ),
    Operation(
        "listRuns",
        "get",
        "/api/runs",
        "Runs that have happened (look-ahead rows on request), newest first, filtered and "
        "paginated",
        rs.RunsPage,
        query=rq.RunsQuery,
        errors=READ_ERRORS,
        links=(
            *_to("$response.body#/runs/0/id", "run_id", *_RUN_USES),
            Link("listRuns", "query.cursor", "$response.body#/next_cursor"),
        ),
    ),
    Operation(
        "getRun",
        "get",
        "/api/runs/{run_id}",
        "One run with every attempt's verdict, error, output tail, lease, epoch",
        rs.RunDetail,
        path_params=rq.RunPath,
        errors=READ_ERRORS,
        links=_to("$response.body#/id", "run_id", "cancelRun"),
    ),
    Operation(
        "streamRunOutput",
        "get",
        "/api/runs/{run_id}/output/stream",
        "A run's output as it is printed, from whichever replica runs it (Server-Sent Events)",
        rs.OutputStream,
        path_params=rq.RunPath,
        errors=READ_ERRORS,
        media_type="text/event-stream",
        description=(
            "First the kept tail of each finished attempt and the running attempt's tail so "
            "far, then each chunk as it is printed (at most 64 KiB/s per run is relayed; a "
            "notice says what was dropped), then an `end` event once the run is terminal. "
            "Streams are bounded per replica (503 past the bound) and last an hour at most."
        ),
    ),
    Operation(
        "listActions",
        "get",
        "/api/actions",
        "Operator actions, newest first: who, when, what, arguments, result",
        rs.Actions,
        query=rq.ActionsQuery,
        errors=(400, 503),
        links=(Link("listActions", "query.before", "$response.body#/0/id"),),
    ),
    Operation(
        "listNotifications",
        "get",
        "/api/notifications",
        "Notifications, newest first: run, event, sink, state and every attempt's answer",
        nt.Notifications,
        query=nt.NotificationsQuery,
        errors=(400, 503),
    ),
    Operation(
        "getGrid",
        "get",
        "/api/grid",
        "Each job's last due instants, judged as the audit judges them (the run grid)",
        rs.Grid,
        query=rq.GridQuery,
        errors=(400, 404, 503),
    ),
    Operation(
        "listRejectedJobs",
        "get",
        "/api/config/rejected",
        "The jobs the config file rejected at its last load (start or reload), with the "
        "error; a rejected edit of a job in the catalog leaves its old definition running",
        rs.RejectedJobs,
        errors=(503,),
    ),
    Operation(
        "getConfig",
        "get",
        "/api/config",
        "The config generations (the one in force first) and each replica's config file: "
        "which digest it reports, whether it was refused as older than the one in force, "
        "and whether the replicas disagree (docs/rollout.md)",
        rs.ConfigRollout,
        errors=(503,),
    ),
    Operation(
        "pauseJob",
        "post",
        "/api/jobs/{name}/pause",
        "Stop materializing and claiming the job's runs",
        rs.ActionResult,
        path_params=rq.JobPath,
        errors=ACTION_ERRORS,
        scope=Scope.OPERATE,
    ),
    Operation(
        "resumeJob",
        "post",
        "/api/jobs/{name}/resume",
        "Undo pause",
        rs.ResumeResult,
        path_params=rq.JobPath,
        body=rq.ResumeBody,
        errors=(*ACTION_ERRORS, 408, 415),
        scope=Scope.OPERATE,
    ),
    Operation(
        "triggerJob",
        "post",
        "/api/jobs/{name}/trigger",
        "A run now, for the instant 'at' (default: now); one run per instant still",
        rs.TriggerResult,
        path_params=rq.JobPath,
        body=rq.TriggerBody,
        errors=(*ACTION_ERRORS, 408, 415),
        scope=Scope.OPERATE,
        description=(
            "Adds the run of one instant, due now. `scheduled_instant` in the answer says "
            "whether the schedule names the instant (then this is that instant's run and the "
            "schedule adds no other) or not (an extra run). An instant that already has a run "
            "answers 409."
        ),
        links=_to("$response.body#/run_id", "run_id", *_RUN_USES),
    ),
    Operation(
        "backfillJob",
        "post",
        "/api/jobs/{name}/backfill",
        "One run per instant of the schedule in [from, to] that has no row yet",
        rs.BackfillResult,
        path_params=rq.JobPath,
        body=rq.BackfillBody,
        body_required=True,
        errors=(*ACTION_ERRORS, 408, 415),
        scope=Scope.OPERATE,
    ),
    Operation(
        "cancelRun",
        "post",
        "/api/runs/{run_id}/cancel",
        "Cancel a pending or running run",
        rs.ActionResult,
        path_params=rq.RunPath,
        errors=ACTION_ERRORS,
        scope=Scope.OPERATE,
        links=_to("$request.path.run_id", "run_id", "getRun"),
    ),
    Operation(
        "getStatus",
        "get",
        "/api/status",
        "This replica's view: PostgreSQL and NATS health, duplicate deliveries skipped and "
        "fenced completions (counted since it started)",
        rs.ReplicaStatus,
    ),
    Operation(
        "openapi",
        "get",
        "/openapi.json",
        "This document (OpenAPI 3.1)",
        rs.Document,
        scope=Scope.OPEN,
    ),
    Operation("healthz", "get", "/healthz", "Liveness", rs.Health, scope=Scope.OPEN),
    Operation(
        "readyz",
        "get",
        "/readyz",
        "Readiness: PostgreSQL and NATS reachable ('degraded': reads served, writes refused)",
        rs.Ready,
        other={503: ("not ready", rs.Ready)},
        scope=Scope.OPEN,
    ),
    Operation(
        "metrics",
        "get",
        "/metrics",
        "Prometheus metrics, text exposition format",
        rs.Metrics,
        media_type="text/plain",
        scope=Scope.OPEN,  # a read token with the setting metrics_token (see document())
    ),
)
BY_ID = {op.operation_id: op for op in OPERATIONS}


def scope_of(op: Operation, *, metrics_token: bool = False) -> Scope:
    """What ``op`` asks for on this replica (/metrics: a read token with ``metrics_token``)."""
    if op.operation_id == "metrics" and metrics_token:
        return Scope.READ
    return op.scope

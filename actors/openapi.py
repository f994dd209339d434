"""The OpenAPI 3.1 description of the HTTP API, served at /openapi.json.

Kept true by a test: schemathesis runs every route of this document against a
live replica and checks each response against it.
"""

from __future__ import annotations

from typing import Any

from actors import __version__

TIME_HELP = (
    "ISO 8601, e.g. '2026-12-01 02:00' or '2026-12-01T01:00:00Z', or 'now'. "
    "A time without an offset is read in the job's time zone (UTC where no job "
    "is named)."
)
STATES = ["pending", "claimed", "running", "succeeded", "failed", "skipped", "cancelled"]
STATUSES = [
    "succeeded",
    "failed",
    "skipped",
    "cancelled",
    "dropped",
    "missing",
    "stuck",
    "in_progress",
    "extra",
]


def _s(kind: str, nullable: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": [kind, "null"] if nullable else kind, **extra}


def _obj(props: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


TIME = _s("string", description="UTC, ISO 8601")
TIME_OR_NULL = _s("string", True, description="UTC, ISO 8601")
LOCAL_OR_NULL = _s("string", True, description="the same instant in the job's zone")

RUN = {
    "id": _s("string", format="uuid"),
    "job": _s("string"),
    "timezone": _s("string"),
    "scheduled_at": TIME,
    "scheduled_local": _s("string"),
    "due_at": TIME,
    "state": _s("string", enum=STATES),
    "trigger": _s("string"),
    "attempt": _s("integer"),
    "claim_epoch": _s("integer"),
    "lease_owner": _s("string", True),
    "lease_expires_at": TIME_OR_NULL,
    "claimed_at": TIME_OR_NULL,
    "started_at": TIME_OR_NULL,
    "finished_at": TIME_OR_NULL,
    "outcome": _s("string", True),
    "exit_code": _s("integer", True),
    "error": _s("string", True),
}
JOB = {
    "name": _s("string"),
    "enabled": _s("boolean"),
    "paused": _s("boolean"),
    "schedule": _s("string"),
    "timezone": _s("string"),
    "next_fire": TIME_OR_NULL,
    "next_fire_local": LOCAL_OR_NULL,
    "backlog": _s("integer", description="due and not started (the look-ahead apart)"),
    "oldest_due": TIME_OR_NULL,
    "ahead": _s("integer", description="pending runs written ahead, not yet due"),
    "running": _s("integer"),
    "pending": _s("integer", description="backlog + ahead"),
    "last_outcome": {
        "oneOf": [
            {"type": "null"},
            _obj(
                {
                    "run_id": _s("string"),
                    "state": _s("string"),
                    "outcome": _s("string", True),
                    "error": _s("string", True),
                    "scheduled_at": TIME,
                    "scheduled_local": _s("string"),
                    "finished_at": TIME_OR_NULL,
                }
            ),
        ]
    },
    "last_success": TIME_OR_NULL,
    "last_success_local": LOCAL_OR_NULL,
    "failures_24h": _s("integer"),
    "due_since": TIME_OR_NULL,
}
ATTEMPT = {
    "attempt": _s("integer"),
    "claim_epoch": _s("integer"),
    "worker": _s("string", True),
    "started_at": TIME_OR_NULL,
    "finished_at": TIME_OR_NULL,
    "outcome": _s("string"),
    "exit_code": _s("integer", True),
    "error": _s("string", True),
}
AUDIT_ENTRY = {
    "scheduled_at": TIME,
    "scheduled_local": _s("string"),
    "status": _s("string", enum=STATUSES),
    "problem": _s("boolean"),
    "reason": _s("string", True),
    "run": {
        "oneOf": [
            {"type": "null"},
            _obj(
                {
                    "id": _s("string"),
                    "state": _s("string"),
                    "trigger": _s("string"),
                    "attempt": _s("integer"),
                }
            ),
        ]
    },
}
AUDIT = {
    "job": _s("string"),
    "timezone": _s("string"),
    "from": TIME,
    "to": TIME,
    "from_local": _s("string"),
    "to_local": _s("string"),
    "now": TIME,
    "due_since": TIME_OR_NULL,
    "entries": {"type": "array", "items": _ref("AuditEntry")},
    "summary": _obj(
        {
            "due": _s("integer"),
            "counts": {"type": "object", "additionalProperties": _s("integer")},
            "problems": _s("integer"),
            "not_yet_due": _s("integer"),
            "complete": _s("boolean"),
            "line": _s("string"),
        }
    ),
}
ACTION = {
    "id": _s("integer"),
    "at": TIME,
    "actor": _s("string"),
    "via": _s("string", enum=["cli", "http", "signal"]),
    "origin": _s("string", True),
    "action": _s("string"),
    "job": _s("string", True),
    "run_id": _s("string", True),
    "arguments": {"type": "object"},
    "ok": _s("boolean"),
    "result": _s("string"),
}
ACTION_RESULT = {
    "action": _s("string"),
    "job": _s("string", True),
    "run_id": _s("string", True),
    "message": _s("string"),
    "action_id": _s("integer"),
    "at": TIME,
    "actor": _s("string"),
    "scheduled_at": TIME,
    "added": _s("integer"),
    "existing": _s("integer"),
    "instants": _s("integer"),
}

GRID_CELL = {
    "scheduled_at": TIME,
    "scheduled_local": _s("string"),
    "status": _s("string", enum=STATUSES, description="as `claimd audit` judges the instant"),
    "problem": _s("boolean"),
    "reason": _s("string", True),
    "run_id": _s("string", True),
    "state": _s("string", True, enum=[*STATES, None]),
    "attempt": _s("integer", True),
}
GRID_JOB = {
    "name": _s("string"),
    "timezone": _s("string"),
    "schedule_words": _s(
        "string", description="the schedule in words, e.g. 'every day at 02:00' (the zone apart)"
    ),
    "from": TIME,
    "cells": {"type": "array", "items": _ref("GridCell")},
}
COUNTER = _s("number", minimum=0)
STATUS = {
    "checks": {
        "type": "object",
        "properties": {"postgres": _s("string"), "nats": _s("string")},
        "description": "'ok', or what is wrong",
    },
    "counters": _obj(
        {
            "deliveries_skipped": COUNTER,
            "fenced_completions": COUNTER,
            "redeliveries": COUNTER,
            "deliveries_skipped_by_reason": {"type": "object", "additionalProperties": COUNTER},
        }
    ),
}

SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _s("string")}),
    "Job": _obj(JOB),
    "JobDetail": _obj({**JOB, "recent_runs": {"type": "array", "items": _ref("Run")}}),
    "Run": _obj(RUN),
    "RunDetail": _obj(
        {
            **RUN,
            "output_tail": _s("string", True),
            "lease_expired": _s("boolean"),
            "attempts": {"type": "array", "items": _ref("Attempt")},
        }
    ),
    "Attempt": _obj(ATTEMPT),
    "RunsPage": _obj(
        {
            "runs": {"type": "array", "items": _ref("Run")},
            "next_cursor": _s("string", True, description="pass as cursor for the next page"),
        }
    ),
    "AuditEntry": _obj(AUDIT_ENTRY),
    "Audit": _obj(AUDIT),
    "Action": _obj(ACTION),
    "GridCell": _obj(GRID_CELL),
    "Grid": _obj(
        {"now": TIME, "instants": _s("integer"), "jobs": {"type": "array", "items": _obj(GRID_JOB)}}
    ),
    "Status": _obj(STATUS),
    "ActionResult": _obj(ACTION_RESULT, optional=("scheduled_at", "added", "existing", "instants")),
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "bad input",
        401: "missing or wrong bearer token",
        403: "read-only: no token configured",
        404: "no such job or run",
        409: "nothing to do",
        422: "impossible range",
        503: "database unavailable",
    }
    return {
        str(c): {
            "description": words[c],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for c in codes
    }


def _ok(schema: dict[str, Any], what: str, links: dict[str, Any] | None = None) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": what, "content": {"application/json": {"schema": schema}}}
    if links:
        ok["links"] = links
    return {"200": ok}


def _links(source: str, parameter: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links: where the value this response holds can be used next."""
    return {op: {"operationId": op, "parameters": {parameter: source}} for op in operations}


JOB_LINKS = _links(
    "$response.body#/0/name",
    "name",
    "getJob",
    "auditJob",
    "pauseJob",
    "resumeJob",
    "triggerJob",
    "backfillJob",
)
RUN_LINKS = _links("$response.body#/runs/0/id", "run_id", "getRun", "cancelRun")


def _param(
    name: str, where: str, schema: dict[str, Any], description: str = "", required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }


JOB_NAME = _param("name", "path", _s("string", minLength=1), "the job's name")
RUN_ID = _param("run_id", "path", _s("string", format="uuid"), "the run's id")
READ_ERRORS = (400, 404, 422, 503)
ACTION_ERRORS = (400, 401, 403, 404, 409, 422, 503)
BEARER: list[dict[str, list[str]]] = [{"bearerAuth": []}]


def _action(
    operation_id: str,
    summary: str,
    params: list[dict[str, Any]],
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    links = (
        _links("$response.body#/run_id", "run_id", "getRun")
        if operation_id == "triggerJob"
        else None
    )
    op: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "parameters": params,
        "security": BEARER,
        "responses": {
            **_ok(_ref("ActionResult"), "done and recorded", links),
            **_errors(*ACTION_ERRORS),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": False, "content": {"application/json": {"schema": body}}}
    return {"post": op}


def _time_param(
    name: str, description: str, required: bool = False, example: str | None = None
) -> dict[str, Any]:
    param = _param(
        name, "query", _s("string", minLength=1), f"{description}. {TIME_HELP}", required
    )
    if example:
        param["example"] = example
    return param


READY = _obj({"status": _s("string"), "checks": {"type": "object"}})
PATHS: dict[str, Any] = {
    "/api/jobs": {
        "get": {
            "operationId": "listJobs",
            "summary": "Every job: schedule, next fire, backlog, last outcome",
            "responses": {
                **_ok({"type": "array", "items": _ref("Job")}, "the jobs", JOB_LINKS),
                **_errors(503),
            },
        }
    },
    "/api/jobs/{name}": {
        "get": {
            "operationId": "getJob",
            "summary": "One job and its most recent runs",
            "parameters": [
                JOB_NAME,
                _param(
                    "recent",
                    "query",
                    _s("integer", minimum=0, maximum=1000),
                    "how many recent runs (default 20)",
                ),
            ],
            "responses": {**_ok(_ref("JobDetail"), "the job"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/jobs/{name}/audit": {
        "get": {
            "operationId": "auditJob",
            "summary": "Each due instant in a range with its run, or why it has none",
            "parameters": [
                JOB_NAME,
                _time_param("from", "first instant", True, "2026-01-01 00:00"),
                _time_param("to", "last instant (inclusive)", True, "2026-01-31 23:59"),
            ],
            "responses": {**_ok(_ref("Audit"), "the audit"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/runs": {
        "get": {
            "operationId": "listRuns",
            "summary": "Runs, newest first, filtered and paginated",
            "parameters": [
                _param("job", "query", _s("string", minLength=1), "only this job's runs"),
                _param(
                    "state",
                    "query",
                    {"type": "array", "items": _s("string", enum=STATES)},
                    "only runs in these states (repeat, or comma-separated)",
                ),
                _time_param("since", "scheduled at or after"),
                _time_param("until", "scheduled at or before"),
                _param(
                    "limit",
                    "query",
                    _s("integer", minimum=1, maximum=1000),
                    "page size (default 50)",
                ),
                _param(
                    "cursor", "query", _s("string", minLength=1), "next_cursor of the previous page"
                ),
            ],
            "responses": {
                **_ok(_ref("RunsPage"), "a page of runs", RUN_LINKS),
                **_errors(*READ_ERRORS),
            },
        }
    },
    "/api/runs/{run_id}": {
        "get": {
            "operationId": "getRun",
            "summary": "One run with every attempt's verdict, error, output tail, lease, epoch",
            "parameters": [RUN_ID],
            "responses": {**_ok(_ref("RunDetail"), "the run"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/actions": {
        "get": {
            "operationId": "listActions",
            "summary": "Operator actions, newest first: who, when, what, arguments, result",
            "parameters": [
                _param("job", "query", _s("string", minLength=1)),
                _param("limit", "query", _s("integer", minimum=1, maximum=1000)),
                _param(
                    "before",
                    "query",
                    _s("integer", format="int64", minimum=1, maximum=2**63 - 1),
                    "only ids below this (the id of the last one seen)",
                ),
            ],
            "responses": {
                **_ok({"type": "array", "items": _ref("Action")}, "the actions"),
                **_errors(*READ_ERRORS),
            },
        }
    },
    "/api/grid": {
        "get": {
            "operationId": "getGrid",
            "summary": (
                "Each job's last due instants, judged as the audit judges them (the run grid)"
            ),
            "parameters": [
                _param(
                    "instants",
                    "query",
                    _s("integer", minimum=1, maximum=200),
                    "how many of each job's last instants (default 30)",
                ),
                _param("job", "query", _s("string", minLength=1), "only this job"),
            ],
            "responses": {**_ok(_ref("Grid"), "the grid"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/status": {
        "get": {
            "operationId": "getStatus",
            "summary": "This replica's view: PostgreSQL and NATS health, duplicate deliveries "
            "skipped and fenced completions (counted since it started)",
            "responses": _ok(_ref("Status"), "the replica's status"),
        }
    },
    "/api/jobs/{name}/pause": _action(
        "pauseJob", "Stop materializing and claiming the job's runs", [JOB_NAME]
    ),
    "/api/jobs/{name}/resume": _action("resumeJob", "Undo pause", [JOB_NAME]),
    "/api/jobs/{name}/trigger": _action(
        "triggerJob",
        "A run now, for the instant 'at' (default: now); one run per instant still",
        [JOB_NAME],
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"at": _s("string", description=TIME_HELP)},
        },
    ),
    "/api/jobs/{name}/backfill": _action(
        "backfillJob",
        "One run per instant of the schedule in [from, to] that has no row yet",
        [JOB_NAME],
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["from", "to"],
            "properties": {
                "from": _s("string", minLength=1, description=TIME_HELP),
                "to": _s("string", minLength=1, description=TIME_HELP),
                "max_runs": _s(
                    "integer",
                    minimum=1,
                    maximum=2**63 - 1,
                    description=("refuse a range of more instants (default 1,000,000)"),
                ),
            },
            "example": {"from": "2026-01-01 00:00", "to": "2026-01-07 23:59"},
        },
    ),
    "/api/runs/{run_id}/cancel": _action("cancelRun", "Cancel a pending or running run", [RUN_ID]),
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "responses": _ok({"type": "object"}, "OpenAPI 3.1"),
        }
    },
    "/healthz": {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness",
            "responses": _ok(_obj({"status": _s("string")}), "alive"),
        }
    },
    "/readyz": {
        "get": {
            "operationId": "readyz",
            "summary": "Readiness: PostgreSQL and NATS reachable",
            "responses": {
                **_ok(READY, "ready"),
                "503": {
                    "description": "not ready",
                    "content": {"application/json": {"schema": READY}},
                },
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics",
            "responses": {
                "200": {
                    "description": "text exposition format",
                    "content": {"text/plain": {"schema": _s("string")}},
                }
            },
        }
    },
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "claimd",
            "version": __version__,
            "description": "Runs, audit and operator actions of a claimd deployment. "
            "Reads are open to whoever reaches the port; actions need "
            "a bearer token named in the [claimd] settings.",
        },
        "paths": PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }

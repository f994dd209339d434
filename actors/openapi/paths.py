"""The OpenAPI document's routes: parameters, responses, links, and the document itself."""

from __future__ import annotations

from typing import Any

from actors import __version__
from actors.domain.trigger import EARLIEST_TRIGGER
from actors.openapi.schemas import SCHEMAS, STATES, TIME_HELP, obj, ref, scalar


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
            "content": {"application/json": {"schema": ref("Error")}},
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


JOB_NAME = _param("name", "path", scalar("string", minLength=1), "the job's name")
RUN_ID = _param("run_id", "path", scalar("string", format="uuid"), "the run's id")
READ_ERRORS = (400, 404, 422, 503)
ACTION_ERRORS = (400, 401, 403, 404, 409, 422, 503)
BEARER: list[dict[str, list[str]]] = [{"bearerAuth": []}]


def _action(
    operation_id: str,
    summary: str,
    params: list[dict[str, Any]],
    body: dict[str, Any] | None = None,
    description: str | None = None,
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
            **_ok(ref("ActionResult"), "done and recorded", links),
            **_errors(*ACTION_ERRORS),
        },
    }
    if description is not None:
        op["description"] = description
    if body is not None:
        op["requestBody"] = {"required": False, "content": {"application/json": {"schema": body}}}
    return {"post": op}


def _time_param(
    name: str, description: str, required: bool = False, example: str | None = None
) -> dict[str, Any]:
    param = _param(
        name, "query", scalar("string", minLength=1), f"{description}. {TIME_HELP}", required
    )
    if example:
        param["example"] = example
    return param


READY = obj({"status": scalar("string"), "checks": {"type": "object"}})
PATHS: dict[str, Any] = {
    "/api/jobs": {
        "get": {
            "operationId": "listJobs",
            "summary": "Every job: schedule, next fire, backlog, last outcome",
            "responses": {
                **_ok({"type": "array", "items": ref("Job")}, "the jobs", JOB_LINKS),
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
                    scalar("integer", minimum=0, maximum=1000),
                    "how many recent runs (default 20)",
                ),
            ],
            "responses": {**_ok(ref("JobDetail"), "the job"), **_errors(*READ_ERRORS)},
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
            "responses": {**_ok(ref("Audit"), "the audit"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/runs": {
        "get": {
            "operationId": "listRuns",
            "summary": "Runs that have happened (look-ahead rows on request), newest first, "
            "filtered and paginated",
            "parameters": [
                _param("job", "query", scalar("string", minLength=1), "only this job's runs"),
                _param(
                    "state",
                    "query",
                    {"type": "array", "items": scalar("string", enum=STATES)},
                    "only runs in these states (repeat, or comma-separated)",
                ),
                _time_param("since", "scheduled at or after"),
                _time_param("until", "scheduled at or before"),
                _param(
                    "limit",
                    "query",
                    scalar("integer", minimum=1, maximum=1000),
                    "page size (default 50)",
                ),
                _param(
                    "cursor",
                    "query",
                    scalar("string", minLength=1),
                    "next_cursor of the previous page",
                ),
                _param(
                    "ahead",
                    "query",
                    scalar("string", enum=["true", "false"]),
                    "true: include the runs written ahead of time, not yet due (default false: "
                    "what has happened, scheduled at or before now)",
                ),
            ],
            "responses": {
                **_ok(ref("RunsPage"), "a page of runs", RUN_LINKS),
                **_errors(*READ_ERRORS),
            },
        }
    },
    "/api/runs/{run_id}": {
        "get": {
            "operationId": "getRun",
            "summary": "One run with every attempt's verdict, error, output tail, lease, epoch",
            "parameters": [RUN_ID],
            "responses": {**_ok(ref("RunDetail"), "the run"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/actions": {
        "get": {
            "operationId": "listActions",
            "summary": "Operator actions, newest first: who, when, what, arguments, result",
            "parameters": [
                _param("job", "query", scalar("string", minLength=1)),
                _param("limit", "query", scalar("integer", minimum=1, maximum=1000)),
                _param(
                    "before",
                    "query",
                    scalar("integer", format="int64", minimum=1, maximum=2**63 - 1),
                    "only ids below this (the id of the last one seen)",
                ),
            ],
            "responses": {
                **_ok({"type": "array", "items": ref("Action")}, "the actions"),
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
                    scalar("integer", minimum=1, maximum=200),
                    "how many of each job's last instants (default 30)",
                ),
                _param("job", "query", scalar("string", minLength=1), "only this job"),
            ],
            "responses": {**_ok(ref("Grid"), "the grid"), **_errors(*READ_ERRORS)},
        }
    },
    "/api/config/rejected": {
        "get": {
            "operationId": "listRejectedJobs",
            "summary": "The jobs the config file rejected at its last load (start or reload), "
            "with the error; a rejected edit of a job in the catalog leaves its old "
            "definition running",
            "responses": {
                **_ok({"type": "array", "items": ref("RejectedJob")}, "the rejected jobs"),
                **_errors(503),
            },
        }
    },
    "/api/status": {
        "get": {
            "operationId": "getStatus",
            "summary": "This replica's view: PostgreSQL and NATS health, duplicate deliveries "
            "skipped and fenced completions (counted since it started)",
            "responses": _ok(ref("Status"), "the replica's status"),
        }
    },
    "/api/jobs/{name}/pause": _action(
        "pauseJob", "Stop materializing and claiming the job's runs", [JOB_NAME]
    ),
    "/api/jobs/{name}/resume": _action(
        "resumeJob",
        "Undo pause",
        [JOB_NAME],
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "paused_instants": scalar(
                    "string",
                    enum=["run", "skip"],
                    description=(
                        "the instants that came due while paused: run (default) as the "
                        "job's catch-up policy says (catchup = all runs them all at once); "
                        'skip: none runs, each recorded with the reason "paused"'
                    ),
                )
            },
        },
    ),
    "/api/jobs/{name}/trigger": _action(
        "triggerJob",
        "A run now, for the instant 'at' (default: now); one run per instant still",
        [JOB_NAME],
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "at": scalar(
                    "string",
                    description=(
                        "the instant, at or before now on the database's clock and not "
                        f"before {EARLIEST_TRIGGER.date().isoformat()}; otherwise 422 (a "
                        "future instant would run now and use up that instant's scheduled "
                        f"run). {TIME_HELP}"
                    ),
                )
            },
        },
        description=(
            "Adds the run of one instant, due now. `scheduled_instant` in the answer says "
            "whether the schedule names the instant (then this is that instant's run and "
            "the schedule adds no other) or not (an extra run). An instant that already "
            "has a run answers 409."
        ),
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
                "from": scalar("string", minLength=1, description=TIME_HELP),
                "to": scalar("string", minLength=1, description=TIME_HELP),
                "max_runs": scalar(
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
            "responses": _ok(obj({"status": scalar("string")}), "alive"),
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
                    "content": {"text/plain": {"schema": scalar("string")}},
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

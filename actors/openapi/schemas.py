"""The OpenAPI document's data shapes: runs, jobs, attempts, audit, actions, grid, status."""

from __future__ import annotations

from typing import Any

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
    "paused",
    "pruned",
    "stuck",
    "in_progress",
    "extra",
]

TRIGGERS = ["schedule", "manual", "backfill"]


def scalar(kind: str, nullable: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": [kind, "null"] if nullable else kind, **extra}


def obj(props: dict[str, Any], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
    }


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


TIME = scalar("string", description="UTC, ISO 8601")
TRIGGER = scalar("string", enum=TRIGGERS, description="schedule, manual or backfill")
TIME_OR_NULL = scalar("string", True, description="UTC, ISO 8601")
LOCAL_OR_NULL = scalar("string", True, description="the same instant in the job's zone")

RUN = {
    "id": scalar("string", format="uuid"),
    "job": scalar("string"),
    "timezone": scalar("string"),
    "scheduled_at": TIME,
    "scheduled_local": scalar("string"),
    "due_at": TIME,
    "state": scalar("string", enum=STATES),
    "trigger": scalar("string"),
    "attempt": scalar("integer"),
    "claim_epoch": scalar("integer"),
    "lease_owner": scalar("string", True),
    "lease_expires_at": TIME_OR_NULL,
    "claimed_at": TIME_OR_NULL,
    "started_at": TIME_OR_NULL,
    "finished_at": TIME_OR_NULL,
    "outcome": scalar("string", True),
    "exit_code": scalar("integer", True),
    "error": scalar("string", True),
}
JOB = {
    "name": scalar("string"),
    "enabled": scalar("boolean"),
    "paused": scalar("boolean"),
    "schedule": scalar("string"),
    "timezone": scalar("string"),
    "schedule_words": scalar("string", description="the schedule in words (the zone apart)"),
    "next_fire": TIME_OR_NULL,
    "next_fire_local": LOCAL_OR_NULL,
    "backlog": scalar("integer", description="due and not started (the look-ahead apart)"),
    "oldest_due": TIME_OR_NULL,
    "oldest_due_age_s": scalar(
        "number", True, description="how long the oldest run due and not started has waited"
    ),
    "ahead": scalar("integer", description="pending runs written ahead, not yet due"),
    "running": scalar("integer"),
    "pending": scalar("integer", description="backlog + ahead"),
    "last_outcome": {
        "oneOf": [
            {"type": "null"},
            obj(
                {
                    "run_id": scalar("string"),
                    "state": scalar("string"),
                    "outcome": scalar("string", True),
                    "error": scalar("string", True),
                    "scheduled_at": TIME,
                    "scheduled_local": scalar("string"),
                    "finished_at": TIME_OR_NULL,
                    "trigger": TRIGGER,
                }
            ),
        ]
    },
    "last_success": TIME_OR_NULL,
    "last_success_local": LOCAL_OR_NULL,
    "failures_24h": scalar("integer"),
    "due_since": TIME_OR_NULL,
    "config_rejected": {
        "oneOf": [
            {"type": "null"},
            obj(
                {
                    "path": scalar("string"),
                    "field": scalar("string", True),
                    "error": scalar("string"),
                    "recorded_at": TIME,
                }
            ),
        ],
        "description": "the config file's rejected edit of this job (its old definition "
        "keeps running), or null",
    },
}
REJECTED_JOB = {
    "job": scalar("string"),
    "path": scalar("string", description="the config file"),
    "field": scalar("string", True),
    "error": scalar("string"),
    "replica": scalar("string", description="the replica whose load found it"),
    "recorded_at": TIME,
    "old_definition_running": scalar(
        "boolean",
        description="the job is in the catalog and enabled: the definition it had before the "
        "rejected edit keeps running (false: the job does not run at all)",
    ),
}
ATTEMPT = {
    "attempt": scalar("integer"),
    "claim_epoch": scalar("integer"),
    "worker": scalar("string", True),
    "started_at": TIME_OR_NULL,
    "finished_at": TIME_OR_NULL,
    "outcome": scalar(
        "string",
        description="the attempt's verdict; 'running' for the attempt running now, "
        "'cancelled' for one the run's cancel ended",
    ),
    "exit_code": scalar("integer", True),
    "error": scalar("string", True),
    "duration_s": scalar(
        "number", True, description="seconds from start to verdict (so far, while running)"
    ),
}
AUDIT_ENTRY = {
    "scheduled_at": TIME,
    "scheduled_local": scalar("string"),
    "status": scalar("string", enum=STATUSES),
    "problem": scalar("boolean"),
    "reason": scalar("string", True),
    "run": {
        "oneOf": [
            {"type": "null"},
            obj(
                {
                    "id": scalar("string"),
                    "state": scalar("string"),
                    "trigger": scalar("string"),
                    "attempt": scalar("integer"),
                }
            ),
        ]
    },
}
AUDIT = {
    "job": scalar("string"),
    "timezone": scalar("string"),
    "from": TIME,
    "to": TIME,
    "from_local": scalar("string"),
    "to_local": scalar("string"),
    "now": TIME,
    "due_since": TIME_OR_NULL,
    "nearest_before": scalar(
        "string",
        True,
        description="when the range names no instant of the schedule: the last one before it",
    ),
    "nearest_before_local": LOCAL_OR_NULL,
    "nearest_after": scalar(
        "string",
        True,
        description="when the range names no instant of the schedule: the first one after it",
    ),
    "nearest_after_local": LOCAL_OR_NULL,
    "entries": {"type": "array", "items": ref("AuditEntry")},
    "summary": obj(
        {
            "due": scalar("integer"),
            "counts": {"type": "object", "additionalProperties": scalar("integer")},
            "problems": scalar("integer"),
            "not_yet_due": scalar("integer"),
            "complete": scalar(
                "boolean", description="false too when the range names no instant of the schedule"
            ),
            "instants": scalar("integer", description="instants of the schedule in the range"),
            "line": scalar("string"),
        }
    ),
}
ACTION = {
    "id": scalar("integer"),
    "at": TIME,
    "actor": scalar("string"),
    "via": scalar("string", enum=["cli", "http", "signal"]),
    "origin": scalar("string", True),
    "action": scalar("string"),
    "job": scalar("string", True),
    "run_id": scalar("string", True),
    "arguments": {"type": "object"},
    "ok": scalar("boolean"),
    "result": scalar("string"),
}
ACTION_RESULT = {
    "action": scalar("string"),
    "job": scalar("string", True),
    "run_id": scalar("string", True),
    "message": scalar("string"),
    "action_id": scalar("integer"),
    "at": TIME,
    "actor": scalar("string"),
    "scheduled_at": TIME,
    "scheduled_instant": scalar(
        "boolean", description="trigger: whether the job's schedule names the instant"
    ),
    "added": scalar("integer"),
    "existing": scalar("integer"),
    "instants": scalar("integer"),
}

GRID_CELL = {
    "scheduled_at": TIME,
    "scheduled_local": scalar("string"),
    "status": scalar("string", enum=STATUSES, description="as `claimd audit` judges the instant"),
    "problem": scalar("boolean"),
    "reason": scalar("string", True),
    "run_id": scalar("string", True),
    "state": scalar("string", True, enum=[*STATES, None]),
    "attempt": scalar("integer", True),
    "trigger": scalar(
        "string",
        True,
        enum=[*TRIGGERS, None],
        description="who made the run: the schedule, or an operator (manual, backfill)",
    ),
}
GRID_JOB = {
    "name": scalar("string"),
    "timezone": scalar("string"),
    "schedule_words": scalar(
        "string", description="the schedule in words, e.g. 'every day at 02:00' (the zone apart)"
    ),
    "from": TIME,
    "cells": {"type": "array", "items": ref("GridCell")},
}
COUNTER = scalar("number", minimum=0)
STATUS = {
    "checks": {
        "type": "object",
        "properties": {"postgres": scalar("string"), "nats": scalar("string")},
        "description": "'ok', or what is wrong",
    },
    "counters": obj(
        {
            "deliveries_skipped": COUNTER,
            "fenced_completions": COUNTER,
            "redeliveries": COUNTER,
            "deliveries_skipped_by_reason": {"type": "object", "additionalProperties": COUNTER},
        }
    ),
    "config_rejected": {
        "oneOf": [{"type": "null"}, {"type": "array", "items": ref("RejectedJob")}],
        "description": "the jobs the config file rejected at its last load (null while the "
        "database cannot say)",
    },
}

SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": scalar("string")}),
    "Job": obj(JOB),
    "JobDetail": obj({**JOB, "recent_runs": {"type": "array", "items": ref("Run")}}),
    "Run": obj(RUN),
    "RunDetail": obj(
        {
            **RUN,
            "output_tail": scalar("string", True),
            "lease_expired": scalar("boolean"),
            "attempts": {"type": "array", "items": ref("Attempt")},
        }
    ),
    "Attempt": obj(ATTEMPT),
    "RunsPage": obj(
        {
            "runs": {"type": "array", "items": ref("Run")},
            "next_cursor": scalar("string", True, description="pass as cursor for the next page"),
        }
    ),
    "AuditEntry": obj(AUDIT_ENTRY),
    "Audit": obj(AUDIT),
    "Action": obj(ACTION),
    "GridCell": obj(GRID_CELL),
    "Grid": obj(
        {
            "now": TIME,
            "instants": scalar("integer"),
            "jobs": {"type": "array", "items": obj(GRID_JOB)},
        }
    ),
    "Status": obj(STATUS),
    "RejectedJob": obj(REJECTED_JOB),
    "ActionResult": obj(
        ACTION_RESULT,
        optional=("scheduled_at", "scheduled_instant", "added", "existing", "instants"),
    ),
}

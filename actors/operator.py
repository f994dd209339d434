"""What an operator can ask and do, in one place for the CLI and the HTTP API.

Answers are JSON-ready dicts (the API's documented shapes): the CLI renders
the same dicts whether it reached the database or a replica's API. Times given
without an offset are read in the job's zone; every answer carries UTC and the
job's zone. Every action is recorded in ``operator_actions`` with who asked,
in the same transaction as the change itself.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import asyncpg

from actors.adapters.history import Actor, History, record_action
from actors.adapters.postgres import Operations, UnknownJob
from actors.config import JOB_NAME_PATTERN
from actors.domain import RunState, schedule_from_definition, take
from actors.domain.history import (
    PROBLEMS,
    Audit,
    RangeTooLarge,
    Status,
    audit_range,
    parse_instant,
    zone_name,
    zone_of,
)
from actors.domain.schedule import CronSchedule, IntervalSchedule, load_zone
from actors.observability import get_logger

log = get_logger("operator")
MAX_PAGE = 1000
LOCK_JOB = "SELECT id, paused FROM jobs WHERE name = $1 AND enabled FOR UPDATE"
RUN_STATE = "SELECT state FROM job_runs WHERE id = $1::uuid"
RUN_JOB = "SELECT j.name FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE r.id = $1::uuid"


class OperatorError(Exception):
    """An answer that is not a success; ``status`` is the HTTP status, ``exit`` the CLI's."""

    status = 400
    exit = 2


class BadInput(OperatorError):
    """A malformed argument: a time, a run id, a state, a limit."""


class Unprocessable(OperatorError):
    """Well-formed but impossible: a reversed range, a range too large."""

    status = 422


class NotFound(OperatorError):
    """No such job or run."""

    status = 404
    exit = 3


class Unauthorized(OperatorError):
    """An action without the right bearer token."""

    status = 401


class Forbidden(OperatorError):
    """An action on an API that has no token configured (read-only)."""

    status = 403


class Unavailable(OperatorError):
    """The database (or the replica's API) cannot be reached."""

    status = 503
    exit = 4


class NothingToDo(OperatorError):
    """The action changed nothing (the run is finished, the instant has a row...)."""

    status = 409
    exit = 3


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def local(value: datetime | None, zone: tzinfo) -> str | None:
    return None if value is None else value.astimezone(zone).isoformat()


def _zone(name: str) -> tzinfo:
    return UTC if name == "UTC" else load_zone(name)


def _schedule(definition: str) -> CronSchedule | IntervalSchedule:
    return schedule_from_definition(json.loads(definition)["schedule"])


def run_id_of(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise BadInput(f"{text!r} is not a run id (a UUID such as "
                       "'0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b')") from None


def _states(states: Sequence[str] | None) -> list[str] | None:
    if not states:
        return None
    known = {s.value for s in RunState}
    bad = [s for s in states if s not in known]
    if bad:
        raise BadInput(f"unknown state {bad[0]!r}; one of {', '.join(sorted(known))}")
    return list(states)


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    return limit


def _time(text: str, zone: tzinfo, now: datetime, what: str) -> datetime:
    try:
        return parse_instant(text, zone, now)
    except ValueError as exc:
        raise BadInput(f"{what}: {exc}") from None


def _run_json(row: dict[str, Any]) -> dict[str, Any]:
    zone = _zone(row["timezone"])
    out: dict[str, Any] = {
        "id": row["id"], "job": row["job"], "timezone": row["timezone"],
        "scheduled_at": iso(row["scheduled_at"]),
        "scheduled_local": local(row["scheduled_at"], zone),
        "due_at": iso(row["due_at"]), "state": row["state"], "trigger": row["trigger"],
        "attempt": row["attempt"], "claim_epoch": row["claim_epoch"],
        "lease_owner": row["lease_owner"], "lease_expires_at": iso(row["lease_expires_at"]),
        "claimed_at": iso(row["claimed_at"]), "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]), "outcome": row["outcome"],
        "exit_code": row["exit_code"], "error": row["error"],
    }
    return out


def encode_cursor(row: dict[str, Any]) -> str:
    return f"{iso(row['scheduled_at'])}~{row['id']}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    at, _, run_id = cursor.partition("~")
    try:
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, str(uuid.UUID(run_id))
    except ValueError:
        raise BadInput(f"{cursor!r} is not a cursor this API returned") from None


class OperatorService:
    """Reads and actions over the database, as the CLI and the API offer them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.history = History(pool)

    # --- reads --------------------------------------------------------------------

    async def _job_row(self, name: str) -> dict[str, Any]:
        if not re.match(JOB_NAME_PATTERN, name):  # never a job: not worth a query
            raise NotFound(f"no job named {name!r}")
        row = await self.history.job(name)
        if row is None:
            raise NotFound(f"no job named {name!r}")
        return row

    async def jobs(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every job (or one): schedule, next fire, backlog, last outcome, last success."""
        now = await self.history.now()
        out = []
        for row in await self.history.jobs(name):
            schedule = _schedule(row["definition"])
            zone = zone_of(schedule)
            upcoming = (take(schedule.fire_times(now, now + timedelta(days=3660)), 1)
                        if row["enabled"] else [])
            nxt = upcoming[0] if upcoming else None
            last = None
            if row["last_run_id"] is not None:
                last = {"run_id": row["last_run_id"], "state": row["last_state"],
                        "outcome": row["last_outcome"], "error": row["last_error"],
                        "scheduled_at": iso(row["last_scheduled_at"]),
                        "scheduled_local": local(row["last_scheduled_at"], zone),
                        "finished_at": iso(row["last_finished_at"])}
            out.append({
                "name": row["name"], "enabled": row["enabled"], "paused": row["paused"],
                "schedule": schedule.describe(), "timezone": zone_name(schedule),
                "next_fire": iso(nxt), "next_fire_local": local(nxt, zone),
                "backlog": row["backlog"], "oldest_due": iso(row["oldest_due"]),
                "ahead": row["ahead"], "running": row["running"],
                "pending": row["backlog"] + row["ahead"],
                "last_outcome": last, "last_success": iso(row["last_success"]),
                "last_success_local": local(row["last_success"], zone),
                "failures_24h": row["failures_24h"], "due_since": iso(row["due_since"]),
            })
        return out

    async def job(self, name: str, recent: int = 20) -> dict[str, Any]:
        """One job's overview and its most recent runs."""
        found = await self.jobs(name)
        if not found:
            raise NotFound(f"no job named {name!r}")
        runs = (await self.runs(job=name, limit=recent))["runs"] if recent else []
        return {**found[0], "recent_runs": runs}

    async def runs(self, *, job: str | None = None, states: Sequence[str] | None = None,
                   since: str | None = None, until: str | None = None, limit: int = 50,
                   cursor: str | None = None) -> dict[str, Any]:
        """Runs newest first; ``next_cursor`` continues the listing."""
        wanted = _states(states)
        limit = _limit(limit)
        before = decode_cursor(cursor) if cursor else None
        job_id = None
        zone: tzinfo = UTC
        now = await self.history.now()
        if job is not None:
            row = await self._job_row(job)
            job_id, zone = row["id"], _zone(row["timezone"])
        start = _time(since, zone, now, "since") if since else None
        end = _time(until, zone, now, "until") if until else None
        if start and end and end < start:
            raise Unprocessable(f"until ({iso(end)}) is before since ({iso(start)})")
        rows = await self.history.runs(job_id=job_id, states=wanted, since=start, until=end,
                                       before=before, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return {"runs": [_run_json(r) for r in rows],
                "next_cursor": encode_cursor(rows[-1]) if more else None}

    async def run(self, run_id: str) -> dict[str, Any]:
        """One run with every attempt's verdict, its error, output tail, lease and epoch."""
        found = await self.history.run(run_id_of(run_id))
        if found is None:
            raise NotFound(f"no run {run_id}")
        row, attempts = found
        out = _run_json(row)
        out["output_tail"] = row["output_tail"]
        out["lease_expired"] = (row["lease_expires_at"] is not None
                                and row["lease_expires_at"] < row["now"])
        out["attempts"] = [{**a, "started_at": iso(a["started_at"]),
                            "finished_at": iso(a["finished_at"])} for a in attempts]
        return out

    async def audit(self, job: str, start: str, end: str) -> dict[str, Any]:
        """Each due instant of ``job`` in the range with its row, or why it has none."""
        row = await self._job_row(job)
        schedule = _schedule(row["definition"])
        zone = zone_of(schedule)
        now = row["now"]
        first, last = _time(start, zone, now, "from"), _time(end, zone, now, "to")
        try:
            result = audit_range(schedule, first, last, now, row["due_since"],
                                 *await self.history.audit_records(row["id"], first, last,
                                                                   200_000))
        except RangeTooLarge as exc:
            raise Unprocessable(str(exc)) from None
        except ValueError as exc:
            raise Unprocessable(str(exc)) from None
        return audit_json(job, zone_name(schedule), zone, now, result)

    async def actions(self, *, job: str | None = None, limit: int = 50,
                      before: int | None = None) -> list[dict[str, Any]]:
        """Operator actions, newest first: who, when, what, with what, and the result."""
        limit = _limit(limit)
        if job is not None and not re.match(JOB_NAME_PATTERN, job):
            return []  # no job has such a name, so no action names it
        rows = await self.history.actions(job=job, before=before, limit=limit)
        return [{**r, "at": iso(r["at"]), "arguments": json.loads(r["arguments"])}
                for r in rows]

    # --- actions --------------------------------------------------------------------

    async def _record_refusal(self, actor: Actor, action: str, error: OperatorError,
                              **fields: Any) -> None:
        await record_action(self._pool, actor, action, ok=False, result=str(error), **fields)

    async def pause(self, actor: Actor, job: str) -> dict[str, Any]:
        return await self._set_paused(actor, job, True)

    async def resume(self, actor: Actor, job: str) -> dict[str, Any]:
        return await self._set_paused(actor, job, False)

    async def _set_paused(self, actor: Actor, job: str, paused: bool) -> dict[str, Any]:
        action = "pause" if paused else "resume"
        error: OperatorError | None = None
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(LOCK_JOB, job)
            if row is None:
                error = NotFound(f"no enabled job named {job!r}")
            elif row["paused"] == paused:
                error = NothingToDo(f"{job} is already {'paused' if paused else 'running'}")
            else:
                await (Operations(conn).pause(job) if paused else Operations(conn).resume(job))
                message = f"{'paused' if paused else 'resumed'} {job}"
                return await self._done(conn, actor, action, message, job=job)
        await self._record_refusal(actor, action, error, job=job)
        raise error

    async def trigger(self, actor: Actor, job: str, at: str | None = None) -> dict[str, Any]:
        """A run of ``job`` for the instant ``at`` (default: the database's now), due now."""
        try:
            row = await self._job_row(job)
            instant = (_time(at, _zone(row["timezone"]), row["now"], "at") if at
                       else row["now"])
        except OperatorError as bad:
            await self._record_refusal(actor, "trigger", bad, job=job, arguments={"at": at})
            raise
        arguments = {"at": at, "instant": iso(instant)}
        error: OperatorError
        async with self._pool.acquire() as conn, conn.transaction():
            try:
                run_id = await Operations(conn).trigger(job, instant)
            except UnknownJob:
                run_id, error = None, NotFound(f"no enabled job named {job!r}")
            else:
                error = NothingToDo(f"{job} already has a run at {iso(instant)}; nothing added")
            if run_id is not None:
                return await self._done(conn, actor, "trigger",
                                        f"triggered {job}: run {run_id} at {iso(instant)}",
                                        job=job, run_id=run_id, arguments=arguments,
                                        extra={"scheduled_at": iso(instant)})
        await self._record_refusal(actor, "trigger", error, job=job, arguments=arguments)
        raise error

    async def backfill(self, actor: Actor, job: str, start: str, end: str) -> dict[str, Any]:
        """One run per instant of the schedule in ``[start, end]`` that has no row yet."""
        arguments: dict[str, Any] = {"from": start, "to": end}
        try:
            row = await self._job_row(job)
            zone = _zone(row["timezone"])
            first, last = (_time(start, zone, row["now"], "from"),
                           _time(end, zone, row["now"], "to"))
            if last < first:
                raise Unprocessable(f"the range ends ({iso(last)}) before it starts "
                                    f"({iso(first)})")
        except OperatorError as bad:
            await self._record_refusal(actor, "backfill", bad, job=job, arguments=arguments)
            raise
        arguments.update({"from_instant": iso(first), "to_instant": iso(last)})
        error: OperatorError
        async with self._pool.acquire() as conn, conn.transaction():
            try:
                added = await Operations(conn).backfill(job, first, last)
            except UnknownJob:
                added, error = 0, NotFound(f"no enabled job named {job!r}")
            else:
                error = NothingToDo(f"every instant of {job} in the range already has a row")
            if added:
                return await self._done(conn, actor, "backfill",
                                        f"backfilled {job}: {added} runs added", job=job,
                                        arguments=arguments, extra={"added": added})
        await self._record_refusal(actor, "backfill", error, job=job, arguments=arguments)
        raise error

    async def cancel(self, actor: Actor, run_id: str) -> dict[str, Any]:
        """Cancel a pending or running run; a finished one is left as it is."""
        try:
            ident = run_id_of(run_id)
        except OperatorError as bad:
            await self._record_refusal(actor, "cancel", bad, arguments={"run_id": run_id})
            raise
        async with self._pool.acquire() as conn, conn.transaction():
            if await Operations(conn).cancel(ident, f"cancelled by {actor.name}"):
                return await self._done(conn, actor, "cancel", f"cancelled {ident}",
                                        job=await conn.fetchval(RUN_JOB, ident), run_id=ident)
            state = await conn.fetchval(RUN_STATE, ident)
        error = (NotFound(f"no run {ident}") if state is None
                 else NothingToDo(f"run {ident} is {state}; nothing to cancel"))
        await self._record_refusal(actor, "cancel", error,
                                   run_id=ident if state is not None else None,
                                   arguments={"run_id": ident})
        raise error

    async def _done(self, conn: asyncpg.Connection, actor: Actor, action: str, message: str,
                    *, job: str | None = None, run_id: str | None = None,
                    arguments: dict[str, Any] | None = None,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
        action_id, at = await record_action(conn, actor, action, job=job, run_id=run_id,
                                            arguments=arguments, ok=True, result=message)
        log.debug("operator action", action=action, job=job, run_id=run_id,
                  actor=actor.name, via=actor.via)
        return {"action": action, "job": job, "run_id": run_id, "message": message,
                "action_id": action_id, "at": iso(at), "actor": actor.name, **(extra or {})}


def audit_json(job: str, timezone: str, zone: tzinfo, now: datetime,
               audit: Audit) -> dict[str, Any]:
    """The audit as the API and ``claimd audit --json`` give it."""
    entries = []
    for e in audit.entries:
        run = None if e.run is None else {
            "id": e.run.run_id, "state": e.run.state.value, "trigger": e.run.trigger,
            "attempt": e.run.attempt}
        entries.append({"scheduled_at": iso(e.scheduled_at),
                        "scheduled_local": local(e.scheduled_at, zone),
                        "status": e.status.value, "problem": e.status in PROBLEMS,
                        "reason": e.reason, "run": run})
    counts = {s.value: audit.counts.get(s.value, 0) for s in Status}
    return {
        "job": job, "timezone": timezone, "from": iso(audit.start), "to": iso(audit.end),
        "from_local": local(audit.start, zone), "to_local": local(audit.end, zone),
        "now": iso(now), "due_since": iso(audit.due_since), "entries": entries,
        "summary": {"due": audit.due, "counts": counts, "problems": audit.problems,
                    "not_yet_due": audit.not_yet_due, "complete": audit.complete,
                    "line": summary_line(job, audit)},
    }


def summary_line(job: str, audit: Audit) -> str:
    shown = [f"{n} {s}" for s, n in sorted(audit.counts.items(), key=lambda kv: -kv[1])]
    verdict = "complete" if audit.complete else "INCOMPLETE"
    tail = f"; {audit.not_yet_due} not yet due" if audit.not_yet_due else ""
    return (f"{job}: {audit.due} due instants: {', '.join(shown) or 'none'}{tail} "
            f"-- {verdict}")


__all__ = ["Actor", "BadInput", "Forbidden", "NotFound", "NothingToDo", "OperatorError",
           "OperatorService", "Unauthorized", "Unavailable", "Unprocessable"]

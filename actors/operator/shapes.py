"""The JSON shapes of the API (and of `--json`), and the argument checks they share."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from actors.domain import RunState, decode_job
from actors.domain.history import PROBLEMS, Audit, Status, parse_instant
from actors.domain.pause import PausedInstants
from actors.domain.schedule import CronSchedule, IntervalSchedule, load_zone
from actors.operator.errors import BadInput, Unprocessable
from actors.ports import Resumed

MAX_PAGE = 1000


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def local(value: datetime | None, zone: tzinfo) -> str | None:
    return None if value is None else value.astimezone(zone).isoformat()


def zone_named(name: str) -> tzinfo:
    return UTC if name == "UTC" else load_zone(name)


def schedule_of(definition: str, job: str = "") -> CronSchedule | IntervalSchedule:
    return decode_job(job, definition).schedule


def run_id_of(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise BadInput(
            f"{text!r} is not a run id (a UUID such as '0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b')"
        ) from None


def check_states(states: Sequence[str] | None) -> list[str] | None:
    if not states:
        return None
    known = {s.value for s in RunState}
    bad = [s for s in states if s not in known]
    if bad:
        raise BadInput(f"unknown state {bad[0]!r}; one of {', '.join(sorted(known))}")
    return list(states)


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    return limit


def parse_time(text: str, zone: tzinfo, now: datetime, what: str) -> datetime:
    try:
        return parse_instant(text, zone, now)
    except ValueError as exc:
        raise BadInput(f"{what} {exc}") from None
    except OverflowError:
        # Well formed, and off the calendar once read in UTC ('0001-01-01T00:00+01:00').
        raise Unprocessable(
            f"{what} {text!r} falls outside the years 1 to 9999 once read in UTC"
        ) from None


def run_json(row: Mapping[str, Any]) -> dict[str, Any]:
    zone = zone_named(row["timezone"])
    out: dict[str, Any] = {
        "id": row["id"],
        "job": row["job"],
        "timezone": row["timezone"],
        "scheduled_at": iso(row["scheduled_at"]),
        "scheduled_local": local(row["scheduled_at"], zone),
        "due_at": iso(row["due_at"]),
        "state": row["state"],
        "trigger": row["trigger"],
        "attempt": row["attempt"],
        "claim_epoch": row["claim_epoch"],
        "lease_owner": row["lease_owner"],
        "lease_expires_at": iso(row["lease_expires_at"]),
        "claimed_at": iso(row["claimed_at"]),
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "outcome": row["outcome"],
        "exit_code": row["exit_code"],
        "error": row["error"],
    }
    return out


def encode_cursor(row: Mapping[str, Any]) -> str:
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


def audit_json(
    job: str, timezone: str, zone: tzinfo, now: datetime, audit: Audit
) -> dict[str, Any]:
    """The audit as the API and ``claimd audit --json`` give it."""
    entries = []
    for e in audit.entries:
        run = (
            None
            if e.run is None
            else {
                "id": e.run.run_id,
                "state": e.run.state.value,
                "trigger": e.run.trigger,
                "attempt": e.run.attempt,
            }
        )
        entries.append(
            {
                "scheduled_at": iso(e.scheduled_at),
                "scheduled_local": local(e.scheduled_at, zone),
                "status": e.status.value,
                "problem": e.status in PROBLEMS,
                "reason": e.reason,
                "run": run,
            }
        )
    counts = {s.value: audit.counts.get(s.value, 0) for s in Status}
    return {
        "job": job,
        "timezone": timezone,
        "from": iso(audit.start),
        "to": iso(audit.end),
        "from_local": local(audit.start, zone),
        "to_local": local(audit.end, zone),
        "now": iso(now),
        "due_since": iso(audit.due_since),
        # When the range names no instant of the schedule: the nearest ones.
        "nearest_before": iso(audit.nearest_before),
        "nearest_before_local": local(audit.nearest_before, zone),
        "nearest_after": iso(audit.nearest_after),
        "nearest_after_local": local(audit.nearest_after, zone),
        "entries": entries,
        "summary": {
            "due": audit.due,
            "counts": counts,
            "problems": audit.problems,
            "not_yet_due": audit.not_yet_due,
            "complete": audit.complete,
            "instants": audit.named,
            "line": summary_line(job, audit, zone),
        },
    }


def summary_line(job: str, audit: Audit, zone: tzinfo = UTC) -> str:
    if audit.named == 0:
        asked = (
            f"{_wall(audit.start, zone)}"
            if audit.start == audit.end
            else f"{_wall(audit.start, zone)} to {_wall(audit.end, zone)}"
        )
        what = "is not an instant" if audit.start == audit.end else "holds no instant"
        return (
            f"{job}: {asked} {what} of the schedule; nearest before: "
            f"{_wall(audit.nearest_before, zone)}, after: {_wall(audit.nearest_after, zone)}"
            " -- NOT AN INSTANT"
        )
    shown = [f"{n} {s}" for s, n in sorted(audit.counts.items(), key=lambda kv: -kv[1])]
    verdict = "complete" if audit.complete else "INCOMPLETE"
    tail = f"; {audit.not_yet_due} not yet due" if audit.not_yet_due else ""
    return f"{job}: {audit.due} due instants: {', '.join(shown) or 'none'}{tail} -- {verdict}"


def _wall(value: datetime | None, zone: tzinfo) -> str:
    """An instant in the job's zone, to the second, for a sentence."""
    if value is None:
        return "none"
    return value.astimezone(zone).replace(microsecond=0).isoformat(sep=" ")


def resume_words(
    job: str, paused_instants: PausedInstants, done: Resumed
) -> tuple[str, dict[str, Any]]:
    """A resume's answer: what becomes of the instants due while the job was paused."""
    since = iso(done.paused_at) or "(pause not recorded)"
    # Every key in both answers (null where it does not apply): one shape to declare.
    extra: dict[str, Any] = {
        "paused_instants": paused_instants.value,
        "paused_at": iso(done.paused_at),
        "runs_skipped": None,
        "instants_gapped": None,
        "runs_due_now": None,
        "instants_unwritten": None,
    }
    if paused_instants is PausedInstants.SKIP:
        gapped = sum(g.count for g in done.gaps)
        extra.update({"runs_skipped": done.runs_skipped, "instants_gapped": gapped})
        return (
            f"resumed {job} (paused since {since}): paused instants skipped, none runs: "
            f"{done.runs_skipped:,} runs written ahead now skipped, {gapped:,} instants "
            'not yet written recorded as a gap; both with the reason "paused" '
            "(`--paused-instants run` would have left them to the job's catch-up policy)",
            extra,
        )
    extra.update({"runs_due_now": done.due_now, "instants_unwritten": done.unwritten})
    return (
        f"resumed {job} (paused since {since}): {done.due_now:,} runs due now start now, "
        f"and {done.unwritten:,} instants not yet written are planned as its catch-up "
        f"policy says ({done.policy}); the default, `--paused-instants skip`, would have "
        "skipped them",
        extra,
    )

"""The read models built from the port's rows (actors.operator.models), and the argument
checks the reads share."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from actors.domain import RunState, decode_job, take
from actors.domain.history import PROBLEMS, Audit, Status, parse_instant, zone_name, zone_of
from actors.domain.job_state import JobFacts, job_state
from actors.domain.pause import PausedInstants
from actors.domain.schedule import CronSchedule, IntervalSchedule, load_zone
from actors.operator.errors import BadInput, Unprocessable
from actors.operator.models import Audit as AuditAnswer
from actors.operator.models import (
    AuditEntry,
    AuditRun,
    AuditSummary,
    Job,
    JobRejection,
    LastOutcome,
    RejectedJob,
    Run,
)
from actors.operator.words import schedule_words
from actors.ports import Resumed

MAX_PAGE = 1000


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def local(value: datetime | None, zone: tzinfo) -> str | None:
    return None if value is None else value.astimezone(zone).isoformat()


def utc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def local_of(value: datetime, zone: tzinfo) -> str:
    return value.astimezone(zone).isoformat()


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


def run_of(row: Mapping[str, Any]) -> Run:
    """A run of a listing from its row (the row's columns the model names)."""
    zone = zone_named(row["timezone"])
    return Run.from_row(row, scheduled_local=local(row["scheduled_at"], zone))


def job_of(row: Mapping[str, Any], now: datetime, rejected: RejectedJob | None) -> Job:
    """A job of the listing from its row, its state decided (actors.domain.job_state).

    ``rejected``: the config file's rejected edit of the job, if any.
    """
    schedule = schedule_of(row["definition"])
    zone = zone_of(schedule)
    live = row["enabled"] and not row["paused"]
    upcoming = take(schedule.fire_times(now, now + timedelta(days=3660)), 1) if live else []
    nxt = upcoming[0] if upcoming else None
    last = None
    if row["last_run_id"] is not None:
        last = LastOutcome(
            run_id=row["last_run_id"],
            state=row["last_state"],
            outcome=row["last_outcome"],
            error=row["last_error"],
            scheduled_at=row["last_scheduled_at"],
            scheduled_local=local_of(row["last_scheduled_at"], zone),
            finished_at=row["last_finished_at"],
            trigger=row["last_trigger"],
        )
    # While paused nothing is claimed: nothing is due (as claimd_job_overdue_runs says).
    paused = row["paused"]
    oldest = None if paused else row["oldest_due"]
    age = None if oldest is None else now - oldest  # the database's clock
    state = job_state(
        JobFacts(
            enabled=row["enabled"],
            paused=paused,
            last_state=row["last_state"],
            running=row["running"],
            oldest_due_age=age,
            rejected=rejected is not None,
        )
    )
    return Job.from_row(
        row,
        state=state,
        schedule=schedule.describe(),
        schedule_words=schedule_words(schedule),
        timezone=zone_name(schedule),
        next_fire=nxt,
        next_fire_local=local(nxt, zone),
        backlog=0 if paused else row["backlog"],
        overdue=0 if paused else row["overdue"],
        oldest_due=oldest,
        oldest_due_age_s=None if age is None else age.total_seconds(),
        pending=row["backlog"] + row["ahead"],
        last_outcome=last,
        last_success_local=local(row["last_success"], zone),
        config_rejected=None
        if rejected is None
        else JobRejection(
            path=rejected.path,
            field=rejected.field,
            error=rejected.error,
            recorded_at=rejected.recorded_at,
        ),
    )


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


def audit_of(job: str, timezone: str, zone: tzinfo, now: datetime, audit: Audit) -> AuditAnswer:
    """The audit as the API and ``claimd audit`` give it."""
    entries = [
        AuditEntry(
            scheduled_at=utc(e.scheduled_at),
            scheduled_local=local_of(e.scheduled_at, zone),
            status=e.status,
            problem=e.status in PROBLEMS,
            reason=e.reason,
            run=None
            if e.run is None
            else AuditRun.model_validate(
                {
                    "id": e.run.run_id,
                    "state": e.run.state,
                    "trigger": e.run.trigger,
                    "attempt": e.run.attempt,
                }
            ),
        )
        for e in audit.entries
    ]
    summary = AuditSummary(
        due=audit.due,
        counts={s: audit.counts.get(s.value, 0) for s in Status},
        problems=audit.problems,
        not_yet_due=audit.not_yet_due,
        complete=audit.complete,
        instants=audit.named,
        line=summary_line(job, audit, zone),
    )
    return AuditAnswer.model_validate(
        {
            "job": job,
            "timezone": timezone,
            "from": audit.start,
            "to": audit.end,
            "from_local": local(audit.start, zone),
            "to_local": local(audit.end, zone),
            "now": now,
            "due_since": audit.due_since,
            # When the range names no instant of the schedule: the nearest ones.
            "nearest_before": audit.nearest_before,
            "nearest_before_local": local(audit.nearest_before, zone),
            "nearest_after": audit.nearest_after,
            "nearest_after_local": local(audit.nearest_after, zone),
            "entries": entries,
            "summary": summary,
        }
    )


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

"""History: instants dropped on purpose, and the audit of a range ("did 02:00 run?").

Pure: the caller reads the rows, the gaps and the database's ``now`` and passes
them in; the audit says, for every instant the schedule made due in the range,
what became of it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from actors.domain.runs import RunState
from actors.domain.schedule import CronSchedule, IntervalSchedule, take
from actors.domain.zones import local_to_instant

# An audit enumerates instants one by one; a wider range is refused with this
# number in the message rather than answered in part.
MAX_AUDIT_INSTANTS = 10_000
# How the reason of an instant skipped because its job was paused begins (a run
# skipped on resume, or a gap recorded then: actors.domain.pause); the audit
# lists such a gap as paused, not as dropped.
PAUSED_REASON = "paused"


@dataclass(frozen=True)
class Gap:
    """Consecutive instants of a schedule that were dropped on purpose, and why."""

    first: datetime
    last: datetime
    count: int
    reason: str


@dataclass(frozen=True)
class RunRecord:
    """What the audit needs to know of one ``job_runs`` row."""

    run_id: str
    scheduled_at: datetime
    state: RunState
    trigger: str
    attempt: int
    error: str | None = None
    lease_expires_at: datetime | None = None


class Status(enum.StrEnum):
    """What became of one due instant."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # terminal failure: a problem
    SKIPPED = "skipped"  # a policy said no; the reason is kept
    CANCELLED = "cancelled"  # an operator (or a removal) said no
    DROPPED = "dropped"  # no row: the catch-up policy dropped it, recorded as a gap
    MISSING = "missing"  # no row and no recorded reason: a hole in the history
    PAUSED = "paused"  # no row: the job was paused then (an operator's pause, recorded)
    PRUNED = "pruned"  # no row: older than history_retention, pruned with its history
    STUCK = "stuck"  # claimed or running, but its lease has expired
    IN_PROGRESS = "in_progress"  # pending, claimed or running within its lease
    EXTRA = "extra"  # a row at an instant the schedule does not name (trigger)


PROBLEMS = frozenset({Status.FAILED, Status.MISSING, Status.STUCK})
UNFINISHED = frozenset({Status.IN_PROGRESS})


@dataclass(frozen=True)
class AuditEntry:
    """One instant of the range and its row (or the gap that explains its absence)."""

    scheduled_at: datetime
    status: Status
    run: RunRecord | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Audit:
    """Every due instant of a range, accounted for."""

    start: datetime
    end: datetime
    due_since: datetime | None  # instants before this were never due
    entries: list[AuditEntry]
    not_yet_due: int  # instants of the range after the database's now
    counts: dict[str, int] = field(default_factory=dict)
    named: int = 1  # instants of the schedule in the range, due or not
    # When the range names no instant: the schedule's nearest ones around it.
    nearest_before: datetime | None = None
    nearest_after: datetime | None = None

    @property
    def due(self) -> int:
        return sum(1 for e in self.entries if e.status is not Status.EXTRA)

    @property
    def problems(self) -> int:
        return sum(1 for e in self.entries if e.status in PROBLEMS)

    @property
    def complete(self) -> bool:
        """Nothing missing, failed, stuck or still unfinished; and the range names an instant.

        A range the schedule names no instant in answers nothing about "did it
        run", so it is not complete (an operator asked about a time that is not
        the job's).
        """
        if self.named == 0:
            return False
        return not any(e.status in PROBLEMS | UNFINISHED for e in self.entries)


class RangeTooLarge(ValueError):
    """The range names more instants than one audit enumerates."""


def zone_of(schedule: CronSchedule | IntervalSchedule) -> tzinfo:
    """The zone an operator reads the job's times in (UTC for interval jobs)."""
    return schedule.zone if isinstance(schedule, CronSchedule) else UTC


def zone_name(schedule: CronSchedule | IntervalSchedule) -> str:
    return schedule.timezone if isinstance(schedule, CronSchedule) else "UTC"


def parse_instant(text: str, zone: tzinfo, now: datetime) -> datetime:
    """An operator's time: ISO 8601, ``now``; without an offset read in ``zone``.

    A local time that does not exist (spring forward) is the end of the gap and
    one that happens twice (fall back) its first occurrence, as for cron.
    """
    value = text.strip()
    if value.lower() == "now":
        return now
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO 8601 time (e.g. '2026-12-01 02:00', read in "
            f"{getattr(zone, 'key', 'UTC')}; '2026-12-01T01:00Z'; or 'now')"
        ) from None
    try:
        if parsed.tzinfo is not None:
            return parsed.astimezone(UTC)
        if isinstance(zone, ZoneInfo):
            return local_to_instant(parsed, zone)
        return parsed.replace(tzinfo=UTC)
    except OverflowError:  # year 1 or 9999 moved across an offset
        raise ValueError(f"{text!r} is outside the years 1 to 9999 in UTC") from None


def audit_instants(
    schedule: CronSchedule | IntervalSchedule, start: datetime, end: datetime
) -> list[datetime]:
    """The instants of ``schedule`` in ``[start, end]``: ValueError for a reversed range,
    RangeTooLarge past MAX_AUDIT_INSTANTS (checked before any history is read)."""
    if end < start:
        raise ValueError(
            f"the range ends ({end.isoformat()}) before it starts ({start.isoformat()})"
        )
    instants = take(
        schedule.fire_times(start - timedelta(microseconds=1), end), MAX_AUDIT_INSTANTS + 1
    )
    if len(instants) > MAX_AUDIT_INSTANTS:
        raise RangeTooLarge(
            f"the range holds more than {MAX_AUDIT_INSTANTS} instants of "
            "the schedule; audit a shorter range"
        )
    return instants


def audit_range(
    schedule: CronSchedule | IntervalSchedule,
    start: datetime,
    end: datetime,
    now: datetime,
    due_since: datetime | None,
    runs: Sequence[RunRecord],
    gaps: Sequence[Gap],
    paused: Sequence[tuple[datetime, datetime | None]] = (),
    pruned_through: datetime | None = None,
) -> Audit:
    """What became of every instant of ``schedule`` in ``[start, end]`` that was due.

    An instant is due when it is not after ``now`` and not before ``due_since``
    (where the job's current schedule began). A row for an instant counts
    whatever else is recorded; an instant with no row is ``dropped`` when a
    recorded gap covers it, else ``missing``. Rows at instants the schedule does
    not name (a trigger at an arbitrary time) are listed as ``extra``.

    An instant with neither a row nor a gap is ``paused`` inside one of the
    ``paused`` spans (from a pause to its resume, or still paused: None), and
    ``pruned`` at or before ``pruned_through`` (history retention deleted the
    job's rows up to there); only otherwise ``missing``. A range that names no
    instant of the schedule says which are nearest before and after it.
    """
    instants = audit_instants(schedule, start, end)
    due = [t for t in instants if t <= now and (due_since is None or t >= due_since)]
    by_instant = {r.scheduled_at: r for r in runs}
    ordered_gaps = sorted(gaps, key=lambda g: g.first)
    entries: list[AuditEntry] = []
    for instant in due:
        run = by_instant.pop(instant, None)
        if run is not None:
            entries.append(_judge(instant, run, now))
            continue
        entries.append(_without_row(instant, ordered_gaps, paused, pruned_through))
    named = set(instants)
    for run in by_instant.values():
        if run.scheduled_at > now or not start <= run.scheduled_at <= end:
            continue  # not yet due (the look-ahead): counted in not_yet_due
        if run.scheduled_at in named:
            # An instant from before the current schedule began that has a row
            # all the same (a backfill, or the previous schedule named it too).
            entries.append(_judge(run.scheduled_at, run, now))
        else:
            entries.append(
                AuditEntry(
                    run.scheduled_at,
                    Status.EXTRA,
                    run,
                    f"{run.trigger} run at an instant the schedule does not name; {run.state}",
                )
            )
    entries.sort(key=lambda e: e.scheduled_at)
    counts = Counter(e.status.value for e in entries)
    before = after = None
    if not instants:
        before, after = nearest_instants(schedule, start, end)
    return Audit(
        start=start,
        end=end,
        due_since=due_since,
        entries=entries,
        not_yet_due=sum(1 for t in instants if t > now),
        counts=dict(counts),
        named=len(instants),
        nearest_before=before,
        nearest_after=after,
    )


# How far the nearest instant before a range is looked for (a yearly cron's
# previous instant is within a year; a cron that names 29 February, four).
NEAREST_LOOKBACK = timedelta(days=4 * 366 + 1)


def nearest_instants(
    schedule: CronSchedule | IntervalSchedule, start: datetime, end: datetime
) -> tuple[datetime | None, datetime | None]:
    """The schedule's last instant before ``start`` and first after ``end``."""
    after = take(schedule.fire_times(end, end + NEAREST_LOOKBACK), 1)
    before: datetime | None = None
    # Widened fourfold until it holds an instant: the instants enumerated stay
    # a small multiple of one window's.
    window = schedule.every if isinstance(schedule, IntervalSchedule) else timedelta(minutes=1)
    just_before = start - timedelta(microseconds=1)
    while before is None:
        found = take(schedule.fire_times(start - window, just_before), MAX_AUDIT_INSTANTS)
        if found:
            before = found[-1]
        elif window >= NEAREST_LOOKBACK:
            break
        window *= 4
    return before, after[0] if after else None


def _without_row(
    instant: datetime,
    gaps: Sequence[Gap],
    paused: Sequence[tuple[datetime, datetime | None]],
    pruned_through: datetime | None,
) -> AuditEntry:
    """What became of a due instant that has no run row."""
    gap = next((g for g in gaps if g.first <= instant <= g.last), None)
    if gap is not None:
        paused_gap = gap.reason.startswith(PAUSED_REASON + " ")
        return AuditEntry(
            instant, Status.PAUSED if paused_gap else Status.DROPPED, reason=gap.reason
        )
    for since, until in paused:
        if since <= instant and (until is None or instant < until):
            end = f"resumed {until.isoformat()}" if until else "still paused"
            return AuditEntry(instant, Status.PAUSED, reason=f"paused {since.isoformat()}; {end}")
    if pruned_through is not None and instant <= pruned_through:
        return AuditEntry(
            instant,
            Status.PRUNED,
            reason="older than history_retention: the job's history up to "
            f"{pruned_through.isoformat()} was pruned",
        )
    return AuditEntry(instant, Status.MISSING, reason="no run row and no recorded reason")


def _judge(instant: datetime, run: RunRecord, now: datetime) -> AuditEntry:
    state = run.state
    if state is RunState.SUCCEEDED:
        return AuditEntry(instant, Status.SUCCEEDED, run)
    if state is RunState.FAILED:
        return AuditEntry(instant, Status.FAILED, run, run.error)
    if state is RunState.SKIPPED:
        return AuditEntry(instant, Status.SKIPPED, run, run.error)
    if state is RunState.CANCELLED:
        return AuditEntry(instant, Status.CANCELLED, run, run.error)
    if (
        state in (RunState.CLAIMED, RunState.RUNNING)
        and run.lease_expires_at is not None
        and run.lease_expires_at < now
    ):
        return AuditEntry(
            instant,
            Status.STUCK,
            run,
            f"{state} but its lease expired at {run.lease_expires_at.isoformat()}",
        )
    return AuditEntry(instant, Status.IN_PROGRESS, run, str(state))

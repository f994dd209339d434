"""Which instants the materializer writes, given what it wrote before.

Pure: the caller passes ``now``, so catch-up after downtime is tested by moving
a clock, not by waiting. In claimd ``now`` is always the database's clock (read
once per tick) and a new job's ``first_seen`` is the database's record of when
the job was added: replicas whose own clocks disagree then plan the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain.durations import format_duration
from actors.domain.history import Gap
from actors.domain.jobs import Catchup, Job
from actors.domain.refusals import SkipReason
from actors.domain.schedule import MAX_INSTANTS_PER_PLAN, deterministic_offset, take

# The least lateness an instant may have when first planned and still be on
# time rather than missed: a job's first tick after it was added, or a tick
# that came a little late, must not drop instants under catchup latest/none.
# (The materializer's tolerance is this or two of its intervals; a removal's
# accounting of the instants no tick reached uses it as it is.)
MIN_ON_TIME = timedelta(seconds=5)


@dataclass(frozen=True)
class PlannedRun:
    """One row to insert: the instant the schedule names and when it may be claimed."""

    scheduled_at: datetime
    due_at: datetime


@dataclass(frozen=True)
class Plan:
    """Rows to insert, and the high-water mark to record afterwards."""

    runs: list[PlannedRun]
    materialized_until: datetime
    missed: int  # past instants the catch-up policy dropped
    # The same instants as ranges with their reason, written with the plan so
    # that history has no silent hole.
    dropped: tuple[Gap, ...] = ()


def plan_materialization(
    job: Job,
    materialized_until: datetime | None,
    now: datetime,
    horizon: timedelta,
    *,
    first_seen: datetime | None = None,
    on_time: timedelta = timedelta(0),
) -> Plan:
    """Instants after ``materialized_until`` up to ``now + horizon``, per catch-up policy.

    A job never planned before starts at ``first_seen`` (when the database
    recorded it; never later than ``now``), else at ``now``: claimd does not
    invent a history for it (use backfill for that), nor drop the instants that
    fell due between its creation and its first plan. An instant at most
    ``on_time`` before ``now`` is late, not missed: it is planned whatever the
    policy, as a tick that comes a little late must not lose it. Older past
    instants (downtime) are kept according to ``job.catchup`` within
    ``job.catchup_window``.
    """
    until = now + horizon
    if materialized_until is not None:
        after = materialized_until
    else:
        after = now if first_seen is None else min(first_seen, now)
    if after >= until:
        return Plan(runs=[], materialized_until=after, missed=0)
    missed_before = now - on_time
    instants = take(job.schedule.fire_times(after, until))
    past = [t for t in instants if t < missed_before]
    on_schedule = [t for t in instants if t >= missed_before]
    kept_past = _apply_catchup(job, past, now)
    if job.catchup is Catchup.LATEST and kept_past and len(instants) >= MAX_INSTANTS_PER_PLAN:
        # A capped plan is one chunk of a long catch-up: its latest past
        # instant is not the latest overall while a later past instant exists.
        later = take(job.schedule.fire_times(instants[-1], missed_before), 1)
        if later and later[0] < missed_before:
            kept_past = []
    runs = [
        PlannedRun(
            scheduled_at=t,
            due_at=t + deterministic_offset(f"{job.name}@{t.isoformat()}", job.jitter),
        )
        for t in [*kept_past, *on_schedule]
    ]
    # If the plan hit the instant cap, the high-water mark is the last instant
    # planned, so the next tick continues from there instead of skipping.
    high = instants[-1] if len(instants) >= MAX_INSTANTS_PER_PLAN else until
    dropped = past[: len(past) - len(kept_past)]  # the policy keeps a suffix of the past
    return Plan(
        runs=runs, materialized_until=high, missed=len(dropped), dropped=_gaps(job, dropped, now)
    )


def plan_until_removal(
    job: Job, materialized_until: datetime | None, now: datetime, *, first_seen: datetime | None
) -> Plan:
    """The instants a job removed from the config at ``now`` came due at since its last plan.

    They came due while it was in the config, so each is owed a row (cancelled
    with the rest of its runs not started): a removal that comes before the
    materializer's next tick (a re-add and a removal a moment apart) must not
    leave an instant with no row and no recorded reason. None after ``now``;
    older ones as a tick of ``now`` would keep them, per catch-up policy.
    """
    return plan_materialization(
        job, materialized_until, now, timedelta(0), first_seen=first_seen, on_time=MIN_ON_TIME
    )


# How far ahead a job's next instant is looked for (a yearly job's is within it).
FAR_AHEAD = timedelta(days=400)
_JUST_BEFORE = timedelta(microseconds=1)  # timestamptz's resolution


@dataclass(frozen=True)
class NextPlan:
    """Where a job's plan may end without changing what is planned, and when it is due again.

    ``mark``: the furthest high-water mark equal in effect to the plan's: just
    before the job's next instant (nothing lies between), so a daily job's
    mark is written once a day and stays ahead of now until that instant.
    ``instant``: that next instant, None when there is none within ``FAR_AHEAD``
    (then ``mark`` is the plan's mark plus ``FAR_AHEAD``, where the search
    resumes).
    """

    mark: datetime
    instant: datetime | None


def next_plan(job: Job, mark: datetime, limit: timedelta = FAR_AHEAD) -> NextPlan:
    """The job's first instant after ``mark``, and the mark that stops just before it."""
    following = take(job.schedule.fire_times(mark, mark + limit), 1)
    if not following:
        return NextPlan(mark + limit, None)
    return NextPlan(max(mark, following[0] - _JUST_BEFORE), following[0])


def _gaps(job: Job, dropped: list[datetime], now: datetime) -> tuple[Gap, ...]:
    """Consecutive dropped instants grouped by why they were dropped."""
    window = format_duration(job.catchup_window)

    def reason(instant: datetime) -> str:
        if job.catchup is Catchup.NONE:
            return "missed while no scheduler ran (catchup = none)"
        if instant < now - job.catchup_window:
            return (
                f"older than catchup_window ({window}) when planned after a downtime "
                f"(catchup = {job.catchup.value})"
            )
        return SkipReason.SUPERSEDED.value

    gaps: list[Gap] = []
    for instant in dropped:
        why = reason(instant)
        if gaps and gaps[-1].reason == why:
            last = gaps[-1]
            gaps[-1] = Gap(last.first, instant, last.count + 1, why)
        else:
            gaps.append(Gap(instant, instant, 1, why))
    return tuple(gaps)


def _apply_catchup(job: Job, past: list[datetime], now: datetime) -> list[datetime]:
    in_window = [t for t in past if t >= now - job.catchup_window]
    if job.catchup is Catchup.ALL:
        return in_window
    if job.catchup is Catchup.LATEST:
        return in_window[-1:]
    return []

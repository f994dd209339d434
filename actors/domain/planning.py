"""Which instants the materializer writes, given what it wrote before.

Pure: the caller passes ``now`` from its clock, so catch-up after downtime is
tested by moving a clock, not by waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain.jobs import Catchup, Job
from actors.domain.schedule import MAX_INSTANTS_PER_PLAN, deterministic_offset, take


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


def plan_materialization(
    job: Job, materialized_until: datetime | None, now: datetime, horizon: timedelta
) -> Plan:
    """Instants after ``materialized_until`` up to ``now + horizon``, per catch-up policy.

    A job seen for the first time starts at ``now``: claimd does not invent a
    history for it (use backfill for that). Instants already in the past after
    downtime are kept according to ``job.catchup`` within ``job.catchup_window``.
    """
    until = now + horizon
    after = now if materialized_until is None else materialized_until
    if after >= until:
        return Plan(runs=[], materialized_until=after, missed=0)
    instants = take(job.schedule.fire_times(after, until))
    past = [t for t in instants if t < now]
    future = [t for t in instants if t >= now]
    kept_past = _apply_catchup(job, past, now)
    if job.catchup is Catchup.LATEST and kept_past and len(instants) >= MAX_INSTANTS_PER_PLAN:
        # A capped plan is one chunk of a long catch-up: its latest past
        # instant is not the latest overall while a later past instant exists.
        later = take(job.schedule.fire_times(instants[-1], now), 1)
        if later and later[0] < now:
            kept_past = []
    runs = [
        PlannedRun(scheduled_at=t, due_at=t + deterministic_offset(f"{job.name}@{t.isoformat()}",
                                                                   job.jitter))
        for t in [*kept_past, *future]
    ]
    # If the plan hit the instant cap, the high-water mark is the last instant
    # planned, so the next tick continues from there instead of skipping.
    high = instants[-1] if len(instants) >= MAX_INSTANTS_PER_PLAN else until
    return Plan(runs=runs, materialized_until=high, missed=len(past) - len(kept_past))


def _apply_catchup(job: Job, past: list[datetime], now: datetime) -> list[datetime]:
    in_window = [t for t in past if t >= now - job.catchup_window]
    if job.catchup is Catchup.ALL:
        return in_window
    if job.catchup is Catchup.LATEST:
        return in_window[-1:]
    return []

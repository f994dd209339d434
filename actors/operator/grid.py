"""The run grid: each job's last due instants, judged as ``claimd audit`` judges them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from actors.config import JOB_NAME_PATTERN
from actors.domain import take
from actors.domain.history import MAX_AUDIT_INSTANTS, PROBLEMS, audit_range, zone_name, zone_of
from actors.domain.schedule import CronSchedule, IntervalSchedule
from actors.operator.errors import BadInput, NotFound
from actors.operator.shapes import iso, local, schedule_of
from actors.operator.words import schedule_words
from actors.ports import HistoryReader

# The grid looks back at most this far for a job's last instants (a yearly job
# shows its last few years, not its whole history).
GRID_LOOKBACK = timedelta(days=4 * 366)
MAX_GRID = 200


async def grid_of(
    history: HistoryReader, instants: int = 30, job: str | None = None
) -> dict[str, Any]:
    """Each job's last ``instants`` due instants, judged as ``audit`` judges them.

    The same rules as the audit over the range that holds the job's last
    ``instants`` due instants (never before the job was due), paused spans
    included: a cell is succeeded, failed, skipped, cancelled, dropped,
    missing, paused, stuck or in_progress, and triggered runs at other
    instants appear as extra. ``trigger`` says whether a run was the
    schedule's or an operator's (manual, backfill). Every job's rows are read
    in one snapshot by two statements, whatever the number of jobs.
    """
    if not 1 <= instants <= MAX_GRID:
        raise BadInput(f"instants must be between 1 and {MAX_GRID}, got {instants}")
    if job is not None and not re.fullmatch(JOB_NAME_PATTERN, job):
        raise NotFound(f"no job named {job!r}")
    now = await history.now()
    rows = await history.jobs(job)
    if job is not None and not rows:
        raise NotFound(f"no job named {job!r}")
    plans = []
    for row in rows:
        schedule = schedule_of(row["definition"])
        plans.append(
            (row, schedule, last_instants_start(schedule, now, row["due_since"], instants))
        )
    records = await history.grid_records(
        [(row["id"], start) for row, _, start in plans], now, MAX_AUDIT_INSTANTS
    )
    paused = await history.paused_spans_of([row["name"] for row in rows])
    out = []
    for row, schedule, start in plans:
        zone = zone_of(schedule)
        result = audit_range(
            schedule,
            start,
            now,
            now,
            row["due_since"],
            *records[row["id"]],
            paused=paused.get(row["name"], []),
            pruned_through=row["history_pruned_through"],
        )
        cells = [
            {
                "scheduled_at": iso(e.scheduled_at),
                "scheduled_local": local(e.scheduled_at, zone),
                "status": e.status.value,
                "problem": e.status in PROBLEMS,
                "reason": e.reason,
                "run_id": e.run.run_id if e.run else None,
                "state": e.run.state.value if e.run else None,
                "attempt": e.run.attempt if e.run else None,
                "trigger": e.run.trigger if e.run else None,
            }
            for e in result.entries[-instants:]
        ]
        out.append(
            {
                "name": row["name"],
                "timezone": zone_name(schedule),
                "schedule_words": schedule_words(schedule),
                "from": iso(start),
                "cells": cells,
            }
        )
    return {"now": iso(now), "instants": instants, "jobs": out}


def last_instants_start(
    schedule: CronSchedule | IntervalSchedule, now: datetime, due_since: datetime | None, count: int
) -> datetime:
    """The start of the shortest range ending at ``now`` that holds ``count`` instants.

    Never before ``due_since`` (instants before it were never due) nor more than
    :data:`GRID_LOOKBACK` back. The window grows fourfold until it holds enough,
    so the instants enumerated stay a small multiple of ``count``.
    """
    floor = now - GRID_LOOKBACK
    if due_since is not None:
        floor = max(floor, due_since)
    window = (
        schedule.every * count if isinstance(schedule, IntervalSchedule) else timedelta(hours=1)
    )
    while True:
        start = floor if window >= now - floor else now - window
        instants = take(
            schedule.fire_times(start - timedelta(microseconds=1), now), MAX_AUDIT_INSTANTS
        )
        if len(instants) >= count:
            return instants[-count]
        if start <= floor or len(instants) >= MAX_AUDIT_INSTANTS:
            return start
        window *= 4

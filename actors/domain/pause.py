"""Resuming a paused job: what becomes of the instants that came due while it was paused.

An operator chooses on resume (``claimd resume JOB --paused-instants run|skip``,
the API's ``paused_instants``):

- ``skip`` (the default, :data:`DEFAULT_PAUSED_INSTANTS`, as Kubernetes'
  ``suspend``): none of them runs, and each is accounted for: a run the
  materializer had written ahead becomes ``skipped`` with the reason, and the
  instants not written yet are recorded as a gap with the reason; the job's
  plan goes on from the resume. Both reasons begin with ``paused``, so the
  audit lists them as paused, never as missing. A job paused for an incident
  (a mail job during an SMTP outage) does not send fifty mails at once on resume.
- ``run``: the job's catch-up policy decides, as after a downtime. With
  ``catchup = "all"`` every paused instant within ``catchup_window`` runs, all
  of them at once; ``latest`` runs the newest; ``none`` runs none.

Pure: the caller passes the pause's moment, the resume's ``now`` (the
database's clock) and the job's high-water mark.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime, timedelta

from actors.domain.history import PAUSED_REASON, Gap
from actors.domain.schedule import IntervalSchedule, Schedule

_TICK = timedelta(microseconds=1)


class PausedInstants(enum.StrEnum):
    """What a resume does with the instants that came due while the job was paused."""

    RUN = "run"  # as the job's catch-up policy says
    SKIP = "skip"  # none runs; each is recorded as skipped (a row) or a gap (the default)


DEFAULT_PAUSED_INSTANTS = PausedInstants.SKIP


def skipped_reason(since: datetime | None, now: datetime, actor: str) -> str:
    """The reason a skipped paused instant carries, row or gap; it begins with ``paused``."""
    began = since.isoformat() if since is not None else "(pause not recorded)"
    return (
        f"{PAUSED_REASON} {began}; resumed {now.isoformat()} by {actor} "
        "with the paused instants skipped"
    )


def unplanned_reason(now: datetime, actor: str) -> str:
    """Why an instant due before the pause, never planned by then, is skipped as well."""
    return (
        "due before the pause and not planned by then (no replica was planning the job); "
        f"skipped on resume {now.isoformat()} by {actor} with the paused instants"
    )


def instants_between(schedule: Schedule, after: datetime, until: datetime) -> Gap | None:
    """The instants of ``schedule`` in ``(after, until]`` as one span (reason left empty).

    An interval schedule is counted by arithmetic, whatever the span; a cron
    schedule is walked (at most one instant a minute).
    """
    if until <= after:
        return None
    if isinstance(schedule, IntervalSchedule):
        step = schedule.every // _TICK
        first_k = (after - schedule.anchor) // _TICK // step + 1
        last_k = (until - schedule.anchor) // _TICK // step
        if last_k < first_k:
            return None
        return Gap(
            schedule.anchor + _TICK * (first_k * step),
            schedule.anchor + _TICK * (last_k * step),
            last_k - first_k + 1,
            "",
        )
    first = last = None
    count = 0
    for instant in schedule.fire_times(after, until):
        first = first or instant
        last = instant
        count += 1
    if first is None or last is None:
        return None
    return Gap(first, last, count, "")


def paused_gaps(
    schedule: Schedule,
    mark: datetime,
    since: datetime | None,
    now: datetime,
    actor: str,
) -> list[Gap]:
    """The gaps that account for the instants in ``(mark, now]`` a skip leaves unwritten.

    ``mark``: the job's high-water mark (every instant up to it has its row, or
    its gap). Those at or after ``since`` (the pause) are paused instants;
    those before it (only when no replica planned the job before its pause)
    are skipped too, with a reason of their own.
    """
    gaps: list[Gap] = []
    pause = since if since is not None else mark
    before = instants_between(schedule, mark, min(now, pause - _TICK))
    if before is not None:
        gaps.append(Gap(before.first, before.last, before.count, unplanned_reason(now, actor)))
    paused = instants_between(schedule, max(mark, pause - _TICK), now)
    if paused is not None:
        reason = skipped_reason(since, now, actor)
        gaps.append(Gap(paused.first, paused.last, paused.count, reason))
    return gaps


def pause_spans(actions: Sequence[tuple[str, datetime]]) -> list[tuple[datetime, datetime | None]]:
    """From each pause to its resume (None: still paused), from the ``(action, at)`` of the
    pauses and resumes that took effect, in the order the action log has them."""
    spans: list[tuple[datetime, datetime | None]] = []
    since: datetime | None = None
    for action, at in actions:
        if action == "pause" and since is None:
            since = at
        elif action == "resume" and since is not None:
            spans.append((since, at))
            since = None
    if since is not None:
        spans.append((since, None))
    return spans

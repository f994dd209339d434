"""Which instants an operator may trigger or backfill, and whether the schedule names one.

A trigger writes the run of one instant (one row per job and instant, for
ever). An instant still ahead is refused: its row would run now, and the
schedule's own run of that instant, when it came due, would find the row taken
and never happen. An instant before ``EARLIEST_TRIGGER`` is refused as a typo
(``1926`` for ``2026``, a year of ``0001``): no job of claimd's ran then, and
such a row would only clutter the history.

A backfill writes runs due now too, so its range obeys the same two rules: it
may not end after now, nor begin before ``EARLIEST_TRIGGER``.

Pure: the caller passes ``now`` read from the database's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from actors.domain.jobs import Overlap
from actors.domain.schedule import Schedule

# Documented in docs/operations.md and in `claimd trigger --help`.
EARLIEST_TRIGGER = datetime(2000, 1, 1, tzinfo=UTC)
_TICK = timedelta(microseconds=1)  # the finest step a timestamptz (and a datetime) holds


def _utc(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


class TriggerRefused(ValueError):
    """The instant may not be triggered; the message says why."""


def names_instant(schedule: Schedule, instant: datetime) -> bool:
    """Whether ``instant`` is one of the instants ``schedule`` makes due."""
    return any(True for _ in schedule.fire_times(instant - _TICK, instant))


def judge_trigger(job: str, schedule: Schedule, instant: datetime, now: datetime) -> bool:
    """Whether ``instant`` is a scheduled instant of ``job``; TriggerRefused if not allowed.

    Allowed: ``EARLIEST_TRIGGER <= instant <= now``.
    """
    if instant > now:
        raise TriggerRefused(
            f"{_utc(instant)} is later than now ({_utc(now)}, the database's "
            f"clock): a trigger runs now, so it would use up that instant and {job}'s "
            "own run of it would never happen; trigger an instant at or before now"
        )
    if instant < EARLIEST_TRIGGER:
        raise TriggerRefused(
            f"{_utc(instant)} is before {EARLIEST_TRIGGER.date().isoformat()}, "
            "the earliest instant a trigger accepts (a mistyped year?)"
        )
    return names_instant(schedule, instant)


def judge_backfill(job: str, first: datetime, last: datetime, now: datetime) -> None:
    """TriggerRefused unless ``EARLIEST_TRIGGER <= first <= last <= now``: as for a trigger."""
    if last < first:
        raise TriggerRefused(f"from {_utc(first)} is after to {_utc(last)}")
    if last > now:
        raise TriggerRefused(
            f"to {_utc(last)} is later than now ({_utc(now)}, the database's clock): a "
            f"backfilled run runs now, so it would use up an instant still ahead and {job}'s "
            "own run of it would never happen; end the range at or before now (--to now); "
            "nothing added"
        )
    if first < EARLIEST_TRIGGER:
        raise TriggerRefused(
            f"from {_utc(first)} is before {EARLIEST_TRIGGER.date().isoformat()}, the "
            "earliest instant a backfill accepts (a mistyped year?); nothing added"
        )


# What an operator's run (a trigger, a backfill) of a job may carry as its own
# overlap mode, by the job's overlap; the first is the default. A job whose
# runs may overlap has nothing to refine (its claim never reads a run's mode);
# a queue job's runs never are skipped for overlap (the skip pass reads only
# forbid jobs), so forbid is not offered there.
RUN_OVERLAP_CHOICES: dict[Overlap, tuple[Overlap, ...]] = {
    Overlap.ALLOW: (Overlap.ALLOW,),
    Overlap.FORBID: (Overlap.QUEUE, Overlap.FORBID, Overlap.ALLOW),
    Overlap.QUEUE: (Overlap.QUEUE, Overlap.ALLOW),
}


def run_overlap(job: str, job_overlap: Overlap, asked: str | None) -> Overlap:
    """The overlap mode an operator's new run of ``job`` is written with.

    By default, ``queue`` for a job with overlap = forbid or queue: a backfill
    of 24 instants runs 24 times, one after another, each waiting while an
    earlier run of the job is active (the job's own forbid would skip all but
    the first). ``forbid`` keeps the job's rule (skipped if a run is active when
    it is due); ``allow`` runs beside the others. TriggerRefused for a mode the
    job does not offer (see RUN_OVERLAP_CHOICES) or a word that is none.
    """
    choices = RUN_OVERLAP_CHOICES[job_overlap]
    if asked is None:
        return choices[0]
    words = ", ".join(c.value for c in choices)
    if asked not in {o.value for o in Overlap}:
        raise TriggerRefused(f"overlap must be one of {words} for {job}, got {asked!r}")
    chosen = Overlap(asked)
    if chosen not in choices:
        raise TriggerRefused(
            f"overlap {chosen.value} does not apply to {job}, whose overlap is "
            f"{job_overlap.value}: choose {words}"
        )
    return chosen

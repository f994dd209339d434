"""Backfill: which instants of a schedule a range holds, counted and cut into chunks.

Pure schedule math; the store only inserts the chunks it is handed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from actors.domain.schedule import IntervalSchedule, Schedule, take

# A backfill writes its rows in statements of this many instants: a long range
# is many short statements (bounded memory, no lock held for minutes), and one
# interrupted half-way is finished by running it again (the rows are idempotent).
BACKFILL_CHUNK = 10_000
# What one backfill may add unless told otherwise: a range typed wrong (years of
# a job every second) is refused before anything is written.
BACKFILL_MAX_RUNS = 1_000_000


@dataclass(frozen=True)
class BackfillProgress:
    """How far a backfill has come: after each chunk, and (covered == instants) at the end."""

    job: str
    instants: int  # instants of the schedule in the range
    covered: int  # instants written or found already written so far
    added: int  # rows inserted so far
    through: datetime | None  # the last instant covered

    @property
    def existing(self) -> int:
        """Instants covered that already had a row (any trigger), so were left alone."""
        return self.covered - self.added

    def after_chunk(self, chunk: list[datetime], added: int) -> BackfillProgress:
        """The progress once ``chunk`` is written, ``added`` of its rows new."""
        return BackfillProgress(
            self.job, self.instants, self.covered + len(chunk), self.added + added, chunk[-1]
        )


class BackfillTooLarge(ValueError):
    """A backfill range holds more instants than allowed; nothing was written."""

    def __init__(self, job: str, instants: int, exact: bool, limit: int) -> None:
        self.job, self.instants, self.exact, self.limit = job, instants, exact, limit
        count = f"{instants:,}" if exact else f"more than {limit:,}"
        super().__init__(
            f"backfill of {job!r} covers {count} instants, over the limit of "
            f"{limit:,} runs per backfill"
        )


def count_instants(
    schedule: Schedule, after: datetime, until: datetime, ceiling: int
) -> tuple[int, bool]:
    """Instants in ``(after, until]``: (count, exact); counting stops past ``ceiling``.

    An interval schedule is counted by arithmetic (exact, whatever the size);
    any other is walked, and a count past the ceiling is a lower bound.
    """
    if isinstance(schedule, IntervalSchedule):
        us = timedelta(microseconds=1)
        step = schedule.every // us
        first = (after - schedule.anchor) // us // step + 1  # k * step > after
        last = (until - schedule.anchor) // us // step  # k * step <= until
        return max(0, last - first + 1), True
    count = 0
    for _ in schedule.fire_times(after, until):
        count += 1
        if count > ceiling:
            return count, False
    return count, True


@dataclass(frozen=True)
class BackfillPlan:
    """The instants of ``schedule`` in ``[start, end]``, counted, to be written in chunks."""

    job: str
    schedule: Schedule
    start: datetime
    end: datetime
    instants: int

    def chunks(self, size: int = BACKFILL_CHUNK) -> Iterator[list[datetime]]:
        """The instants in order, ``size`` at a time."""
        instants = self.schedule.fire_times(self.start - timedelta(microseconds=1), self.end)
        while batch := take(instants, size):
            yield batch

    def nothing_done(self) -> BackfillProgress:
        """The progress before the first chunk."""
        return BackfillProgress(self.job, self.instants, 0, 0, None)


def plan_backfill(
    job: str, schedule: Schedule, start: datetime, end: datetime, max_runs: int = BACKFILL_MAX_RUNS
) -> BackfillPlan:
    """The backfill of ``[start, end]``; BackfillTooLarge past ``max_runs`` instants."""
    after = start - timedelta(microseconds=1)  # fire_times excludes its start
    total, exact = count_instants(schedule, after, end, max_runs)
    if total > max_runs:
        raise BackfillTooLarge(job, total, exact, max_runs)
    return BackfillPlan(job, schedule, start, end, total)

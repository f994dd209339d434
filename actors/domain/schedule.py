"""Schedules: which instants a job is due at. Pure, DST-correct, replica-independent.

Cron follows cron(8) at a change of the zone's UTC offset (DST; documented in
docs/scheduling.md, "Time zones and DST"):

* Cron expressions (read by :mod:`actors.domain.cron`) are evaluated on the
  job's local wall clock (IANA zone).
* A schedule whose minute or hour field starts with ``*`` (``* * * * *``,
  ``*/15 * * * *``, ``30 * * * *``, ``0 */2 * * *``) fires at every real
  instant whose wall time matches: both passes of a repeated hour, nothing in
  a skipped one.
* A fixed-time schedule (minute and hour both fixed: ``30 2 * * *``,
  ``0,30 1-3 * * *``) fires once per local day. Its ``DstPolicy`` says where
  when its wall time is skipped (``gap``: ``shift``, the default, runs at the
  end of the gap, several slots in one gap once between them; ``skip`` does
  not run) or repeated (``fold``: ``first``, the default, ``last`` or ``both``).
* Interval schedules (``every``) are anchored at a fixed instant (the Unix
  epoch unless the job names another), so every replica computes the same
  instants whatever time it started.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from actors.domain import defaults
from actors.domain.cron import CronExpression, parse_cron
from actors.domain.durations import format_duration
from actors.domain.errors import InvalidSchedule
from actors.domain.zones import (
    DEFAULT_DST,
    JUST_BEFORE,
    DstFold,
    DstGap,
    DstNote,
    DstPolicy,
    Stretch,
    day_start,
    days_end,
    load_zone,
    require_aware,
    steady_local_offset,
    stretch_around,
    wall_time,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A materialization window never yields more than this many instants: a bound
# on memory and statement size when a job every 1s meets a long catch-up.
MAX_INSTANTS_PER_PLAN = 100_000


class Schedule(Protocol):
    """Anything that yields the instants a job is due at, in UTC."""

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Instants ``t`` with ``after < t <= until``, increasing, aware UTC."""
        ...

    def describe(self) -> str:
        """The schedule as the config file writes it."""
        ...


@dataclass(frozen=True)
class CronSchedule:
    """A five-field cron expression evaluated in an IANA time zone, with cron(8)'s DST rule.

    The expression is read by :mod:`actors.domain.cron` (crontab(5) rules, not
    croniter's); this class adds the zone and the DST rule (module docstring):
    a wildcard minute or hour fires at every real instant whose wall time
    matches; a fixed time fires once per local day, where ``dst`` says.
    """

    expression: str
    timezone: str = defaults.TIMEZONE
    dst: DstPolicy = DEFAULT_DST

    def __post_init__(self) -> None:
        zone = load_zone(self.timezone)
        # parse_cron refuses what claimd does not fire (L, W, #, ?, seconds,
        # @reboot, bad ranges) and what never fires ("0 0 30 2 *"), at load
        # rather than in a materializer loop.
        object.__setattr__(self, "_cron", parse_cron(self.expression))
        object.__setattr__(self, "_zone", zone)

    @property
    def zone(self) -> ZoneInfo:
        zone: ZoneInfo = object.__getattribute__(self, "_zone")
        return zone

    @property
    def cron(self) -> CronExpression:
        """The parsed expression: the values each field allows and the day rule."""
        cron: CronExpression = object.__getattribute__(self, "_cron")
        return cron

    @property
    def fixed_time(self) -> bool:
        """Minute and hour both fixed: cron(8)'s once-a-day rule (and ``dst``) applies."""
        return not self.cron.wildcard_time

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        require_aware(after)
        require_aware(until)
        zone = self.zone
        # Iterate on the naive local wall clock. On a local day whose UTC
        # offset holds all around it (most days of every zone) a slot is one
        # instant, found by one subtraction. A run of days near an offset
        # change (a "stretch") is walked on real time instead, segment by
        # segment of one offset (_across), where the DST rule is applied.
        after_local = after.astimezone(zone).replace(tzinfo=None)
        # No slot two days past `until`'s wall clock can map to an instant at or
        # before `until` (UTC offsets differ by at most 26 hours), so stop there
        # rather than search on for a sparse expression's next slot.
        until_day = until.astimezone(zone).date()
        last_day = (
            until_day + timedelta(days=2) if until_day < date.max - timedelta(days=2) else date.max
        )
        cursor = after_local
        today = after_local.toordinal()
        if steady_local_offset(zone, today) is None:
            # `after` may sit in a repeated hour: instants after it can have
            # earlier wall times, so the whole stretch is walked on real time.
            stretch = stretch_around(zone, today)
            yield from self._across(stretch, after, until)
            cursor = datetime.combine(date.fromordinal(stretch.last_day), time(23, 59))
        while True:
            day = -1
            offset: timedelta | None = None
            for naive in self.cron.slots_after(cursor, last_day):
                ordinal = naive.toordinal()
                if ordinal != day:
                    day, offset = ordinal, steady_local_offset(zone, ordinal)
                if offset is None:
                    stretch = stretch_around(zone, ordinal)
                    yield from self._across(stretch, after, until)
                    cursor = datetime.combine(date.fromordinal(stretch.last_day), time(23, 59))
                    break
                instant = (naive - offset).replace(tzinfo=UTC)
                if instant > until:
                    return
                if instant <= after:
                    continue
                yield instant
            else:
                return

    def _across(self, stretch: Stretch, after: datetime, until: datetime) -> Iterator[datetime]:
        """The instants in ``(after, until]`` of the slots on a stretch's days, increasing.

        Real time, segment by segment: a slot whose wall time a segment holds
        is the instant ``wall - offset`` there, so a wildcard schedule fires at
        both passes of a repeated hour and at nothing in a skipped one. A
        fixed time follows ``dst``: a skipped slot runs at the change (shift)
        or not (skip); a repeated one in the first pass, the second, or both.
        """
        bounds, offsets = stretch.bounds, stretch.offsets
        days_lo, days_hi = day_start(stretch.first_day), days_end(stretch.last_day)
        last = after
        for i, offset in enumerate(offsets):
            start, end = bounds[i], bounds[i + 1]
            if end <= after:
                continue
            if start > until:
                return
            if self._shifted_into(stretch, i) and start > last:
                # Slots the clock skipped at `start` run there, once between them.
                last = start
                yield start
            lo, hi = self._walls_run(stretch, i)
            lo, hi = max(lo, days_lo), min(hi, days_hi)
            if lo >= hi:
                continue
            cursor = max(lo - JUST_BEFORE, wall_time(last + offset))
            for naive in self.cron.slots_after(cursor, hi.date()):
                if naive >= hi:
                    break
                instant = (naive - offset).replace(tzinfo=UTC)
                if instant > until:
                    return
                if instant > last:
                    last = instant
                    yield instant

    def _shifted_into(self, stretch: Stretch, i: int) -> bool:
        """Whether fixed-time slots the gap starting segment ``i`` skips run at its start."""
        if not self.fixed_time or i == 0 or self.dst.gap is not DstGap.SHIFT:
            return False
        start, before, offset = stretch.bounds[i], stretch.offsets[i - 1], stretch.offsets[i]
        if before >= offset:
            return False
        lo = max(wall_time(start + before), day_start(stretch.first_day))
        return self._any_slot(lo, min(wall_time(start + offset), days_end(stretch.last_day)))

    def _walls_run(self, stretch: Stretch, i: int) -> tuple[datetime, datetime]:
        """The wall times ``[lo, hi)`` whose slots run in segment ``i``.

        All the segment holds, but for a fixed time in a repeated stretch of
        wall clock: ``first`` leaves out the walls that ran before the change
        that starts the segment, ``last`` those that come again after the
        change that ends it.
        """
        bounds, offsets = stretch.bounds, stretch.offsets
        offset = offsets[i]
        lo, hi = wall_time(bounds[i] + offset), wall_time(bounds[i + 1] + offset)
        if not self.fixed_time:
            return lo, hi
        if i > 0 and offsets[i - 1] > offset and self.dst.fold is DstFold.FIRST:
            lo = wall_time(bounds[i] + offsets[i - 1])
        if i + 1 < len(offsets) and offsets[i + 1] < offset and self.dst.fold is DstFold.LAST:
            hi = wall_time(bounds[i + 1] + offsets[i + 1])
        return lo, hi

    def _any_slot(self, lo: datetime, hi: datetime) -> bool:
        """Whether a slot has a wall time in ``[lo, hi)``."""
        if lo >= hi:
            return False
        slot = next(self.cron.slots_after(lo - JUST_BEFORE, hi.date()), None)
        return slot is not None and slot < hi

    def offset_changes(
        self, after: datetime, until: datetime
    ) -> list[tuple[datetime, timedelta, timedelta]]:
        """The zone's UTC-offset changes in ``(after, until]``: (instant, offset before, after)."""
        out: list[tuple[datetime, timedelta, timedelta]] = []
        for stretch in self._stretches(after, until):
            for i in range(1, len(stretch.offsets)):
                if after < stretch.bounds[i] <= until:
                    out.append((stretch.bounds[i], stretch.offsets[i - 1], stretch.offsets[i]))
        return out

    def dst_notes(self, after: datetime, until: datetime) -> list[DstNote]:
        """The slots skipped or repeated by offset changes in ``(after, until]``, and their fate."""
        notes = [n for stretch in self._stretches(after, until) for n in self._notes(stretch)]
        return [
            n
            for n in notes
            if after < n.at <= until or any(after < t <= until for t in (*n.fired, *n.missed))
        ]

    def _stretches(self, after: datetime, until: datetime) -> Iterator[Stretch]:
        zone = self.zone
        day = after.astimezone(zone).toordinal() - 1
        final = until.astimezone(zone).toordinal() + 1
        while day <= final:
            if steady_local_offset(zone, day) is not None:
                day += 1
                continue
            stretch = stretch_around(zone, day)
            yield stretch
            day = stretch.last_day + 1

    def _notes(self, stretch: Stretch) -> Iterator[DstNote]:
        fixed, policy = self.fixed_time, self.dst
        days_lo, days_hi = day_start(stretch.first_day), days_end(stretch.last_day)
        for i in range(1, len(stretch.offsets)):
            at, before, offset = stretch.bounds[i], stretch.offsets[i - 1], stretch.offsets[i]
            gap = before < offset
            lo = max(wall_time(at + min(before, offset)), days_lo)
            hi = min(wall_time(at + max(before, offset)), days_hi)
            if lo >= hi:
                continue
            for wall in self.cron.slots_after(lo - JUST_BEFORE, hi.date()):
                if wall >= hi:
                    break
                if gap:
                    shift = fixed and policy.gap is DstGap.SHIFT
                    rule = (
                        "dst.gap = shift: runs at the end of the gap"
                        if shift
                        else "dst.gap = skip: does not run"
                        if fixed
                        else "wildcard minute/hour: that wall time does not exist, no run"
                    )
                    yield DstNote(wall, "gap", at, (at,) if shift else (), (), rule, at)
                    continue
                both: tuple[datetime, ...] = (
                    (wall - before).replace(tzinfo=UTC),
                    (wall - offset).replace(tzinfo=UTC),
                )
                fired: tuple[datetime, ...]
                if not fixed:
                    fired, rule = both, "wildcard minute/hour: runs at both occurrences"
                elif policy.fold is DstFold.BOTH:
                    fired, rule = both, "dst.fold = both: runs at both occurrences"
                elif policy.fold is DstFold.LAST:
                    fired, rule = both[1:], "dst.fold = last: runs at the second occurrence"
                else:
                    fired, rule = both[:1], "dst.fold = first: runs at the first occurrence"
                missed = tuple(t for t in both if t not in fired)
                yield DstNote(wall, "fold", both[0], fired, missed, rule, at)

    def describe(self) -> str:
        text = f"cron {self.expression!r} in {self.timezone}"
        if self.dst != DEFAULT_DST:
            text += f" (dst: {self.dst.describe()})"
        return text


@dataclass(frozen=True)
class IntervalSchedule:
    """Every fixed period, anchored so that all replicas agree on the instants."""

    every: timedelta
    anchor: datetime = EPOCH

    def __post_init__(self) -> None:
        if self.every <= timedelta(0):
            raise InvalidSchedule("an interval must be greater than zero")
        if self.every < timedelta(milliseconds=1):
            raise InvalidSchedule("an interval must be at least 1ms")
        require_aware(self.anchor)

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        require_aware(after)
        require_aware(until)
        step_us = _micros(self.every)
        offset_us = _micros(after - self.anchor)
        k = offset_us // step_us + 1
        while True:
            instant = self.anchor + timedelta(microseconds=k * step_us)
            if instant > until:
                return
            if instant > after:
                yield instant.astimezone(UTC)
            k += 1

    def describe(self) -> str:
        return f"every {format_duration(self.every)}"


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def deterministic_offset(key: str, spread: timedelta) -> timedelta:
    """An offset in ``[0, spread)`` derived from ``key`` alone.

    Every replica computes the same jitter for the same run, so a run's due
    time never depends on which replica materialized it.
    """
    if spread <= timedelta(0):
        return timedelta(0)
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return timedelta(microseconds=int.from_bytes(digest, "big") % _micros(spread))


def take(instants: Iterator[datetime], limit: int = MAX_INSTANTS_PER_PLAN) -> list[datetime]:
    """At most ``limit`` instants from an iterator (schedules can be endless)."""
    out: list[datetime] = []
    for instant in instants:
        out.append(instant)
        if len(out) >= limit:
            break
    return out

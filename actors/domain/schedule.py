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

import enum
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from actors.domain import defaults
from actors.domain.cron import CronExpression, parse_cron
from actors.domain.durations import format_duration
from actors.domain.errors import InvalidSchedule

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


def load_zone(name: str) -> ZoneInfo:
    """An IANA zone, or InvalidSchedule naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidSchedule(
            f"unknown time zone {name!r} (expected an IANA name such as 'Europe/Berlin' or 'UTC')"
        ) from exc


def _require_aware(value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"schedule math needs aware datetimes, got {value!r}")


def local_to_instant(naive: datetime, zone: ZoneInfo) -> datetime:
    """An operator's local time as an instant: a skipped time is the end of its gap,
    a repeated one its first occurrence (cron's default for a fixed time)."""
    candidate = naive.replace(tzinfo=zone, fold=0)
    if candidate.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == naive:
        # Exists. In a repeated hour fold=0 is the first occurrence.
        return candidate.astimezone(UTC)
    # In a gap: the next valid instant is the end of the gap, the first whole
    # minute that exists (gaps are whole minutes in every IANA zone).
    probe = naive.replace(second=0, microsecond=0)
    for _ in range(24 * 60):
        probe += timedelta(minutes=1)
        moved = probe.replace(tzinfo=zone, fold=0)
        if moved.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == probe:
            return moved.astimezone(UTC)
    raise InvalidSchedule(f"no valid local time after {naive} in {zone.key}")  # pragma: no cover


# A memo, not state: the answers depend on the zone's rules alone. Bounded so
# that a process planning for years of instants does not grow without end.
_STEADY_UTC_DAYS: dict[tuple[ZoneInfo, int], timedelta | None] = {}
_STEADY_LOCAL_DAYS: dict[tuple[ZoneInfo, int], timedelta | None] = {}
_MEMO_LIMIT = 200_000


def _steady_utc_offset(zone: ZoneInfo, ordinal: int) -> timedelta | None:
    """The zone's UTC offset if it is the same all through UTC day ``ordinal``, else None.

    Read at 00:00, 06:00, 12:00, 18:00 and 24:00 UTC: a transition changes the
    offset, and no zone has two transitions that cancel within six hours.
    """
    key = (zone, ordinal)
    if key in _STEADY_UTC_DAYS:
        return _STEADY_UTC_DAYS[key]
    midnight = datetime.combine(date.fromordinal(ordinal), time(), UTC)
    offsets = {
        (midnight + timedelta(hours=h)).astimezone(zone).utcoffset() for h in range(0, 25, 6)
    }
    value = offsets.pop() if len(offsets) == 1 else None
    if len(_STEADY_UTC_DAYS) >= _MEMO_LIMIT:
        _STEADY_UTC_DAYS.clear()
    _STEADY_UTC_DAYS[key] = value
    return value


def _steady_local_offset(zone: ZoneInfo, ordinal: int) -> timedelta | None:
    """The offset that maps every wall-clock time of local day ``ordinal``, if one does.

    The wall times of a local day are instants within the UTC days before,
    of and after it (offsets lie within -12 h and +14 h). When the offset is
    the same all through those three days, every wall time of the day names
    one instant, neither skipped nor repeated, and that instant is
    ``wall - offset``; otherwise None (use local_to_instant).
    """
    key = (zone, ordinal)
    if key in _STEADY_LOCAL_DAYS:
        return _STEADY_LOCAL_DAYS[key]
    value = None
    if date.min.toordinal() < ordinal < date.max.toordinal() - 1:
        around = {_steady_utc_offset(zone, ordinal + d) for d in (-1, 0, 1)}
        if len(around) == 1:
            value = around.pop()
    if len(_STEADY_LOCAL_DAYS) >= _MEMO_LIMIT:
        _STEADY_LOCAL_DAYS.clear()
    _STEADY_LOCAL_DAYS[key] = value
    return value


class DstGap(enum.StrEnum):
    """A fixed-time slot the clock skips (spring forward)."""

    SHIFT = "shift"  # runs once at the end of the gap (cron(8))
    SKIP = "skip"  # does not run that day (recorded as skipped by check-config)


class DstFold(enum.StrEnum):
    """A fixed-time slot the clock repeats (fall back)."""

    FIRST = "first"  # runs at its first occurrence (cron(8))
    LAST = "last"  # runs at its second occurrence
    BOTH = "both"  # runs at both


DEFAULT_GAP = DstGap(defaults.DST_GAP)
DEFAULT_FOLD = DstFold(defaults.DST_FOLD)


@dataclass(frozen=True)
class DstPolicy:
    """Where a fixed-time cron job runs when its wall-clock time is skipped or repeated.

    Only fixed-time schedules (minute and hour both fixed) have a choice: a
    wildcard one runs at every real instant that matches (cron(8)).
    """

    gap: DstGap = DEFAULT_GAP
    fold: DstFold = DEFAULT_FOLD

    def describe(self) -> str:
        return f"gap = {self.gap.value}, fold = {self.fold.value}"


DEFAULT_DST = DstPolicy()


@dataclass(frozen=True)
class DstNote:
    """A slot of a schedule that a UTC-offset change skips or repeats, and what runs.

    ``wall``: the local wall-clock slot; ``kind``: ``gap`` (skipped by the
    clock) or ``fold`` (repeated); ``at``: the instant of the change (gap) or
    the slot's first occurrence (fold); ``fired``: the instants it runs at
    (none: skipped); ``missed``: the real occurrences it does not run at;
    ``change``: the instant the offset changes.
    """

    wall: datetime
    kind: str
    at: datetime
    fired: tuple[datetime, ...]
    missed: tuple[datetime, ...]
    rule: str
    change: datetime


@dataclass(frozen=True)
class _Stretch:
    """Consecutive local days whose wall times are not all one instant each, and their offsets.

    Segment ``i`` is the real time ``[bounds[i], bounds[i + 1])``, all at
    ``offsets[i]``; a wall time of the days ``first_day``..``last_day`` is
    the instant ``wall - offsets[i]`` in each segment whose walls hold it.
    """

    first_day: int
    last_day: int
    bounds: tuple[datetime, ...]
    offsets: tuple[timedelta, ...]


_STRETCHES: dict[tuple[ZoneInfo, int], _Stretch] = {}
# Offsets lie within -12 h and +14 h (LMT a little beyond): an instant whose
# wall time falls on a day lies within this much of that day.
_WALL_REACH = timedelta(hours=27)
_STRETCH_DAYS = 62  # a longer run of unsteady days is cut (none in tzdata)


def _clamped(moment: datetime, delta: timedelta) -> datetime:
    try:
        return moment + delta
    except OverflowError:
        return (
            datetime.max.replace(tzinfo=UTC)
            if delta > timedelta(0)
            else datetime.min.replace(tzinfo=UTC)
        )


def _offset_at(zone: ZoneInfo, moment: datetime) -> timedelta:
    offset = moment.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _segments(
    zone: ZoneInfo, start: datetime, end: datetime
) -> tuple[tuple[datetime, ...], tuple[timedelta, ...]]:
    """``start``, each change of the zone's offset before ``end`` (to the second), ``end``.

    Sampled every hour (no zone changes its offset twice within one), each
    change then bisected to the second.
    """
    bounds, offsets = [start], [_offset_at(zone, start)]
    t = start
    while t < end:
        nxt = min(t + timedelta(hours=1), end)
        offset = _offset_at(zone, nxt)
        if offset != offsets[-1]:
            lo, hi = t, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) // 2
                if _offset_at(zone, mid) == offsets[-1]:
                    lo = mid
                else:
                    hi = mid
            bounds.append(hi.replace(microsecond=0))
            offsets.append(offset)
        t = nxt
    bounds.append(end)
    return tuple(bounds), tuple(offsets)


def _stretch(zone: ZoneInfo, ordinal: int) -> _Stretch:
    """The run of unsteady local days around ``ordinal`` (an unsteady day), memoized."""
    found = _STRETCHES.get((zone, ordinal))
    if found is not None:
        return found
    first = last = ordinal
    low, high = date.min.toordinal() + 1, date.max.toordinal() - 2
    while first > low and ordinal - first < _STRETCH_DAYS:
        if _steady_local_offset(zone, first - 1) is not None:
            break
        first -= 1
    while last < high and last - ordinal < _STRETCH_DAYS:
        if _steady_local_offset(zone, last + 1) is not None:
            break
        last += 1
    start = _clamped(datetime.combine(date.fromordinal(first), time(), UTC), -_WALL_REACH)
    end = _clamped(datetime.combine(date.fromordinal(last), time(), UTC), _WALL_REACH * 2)
    bounds, offsets = _segments(zone, start, end)
    stretch = _Stretch(first, last, bounds, offsets)
    if len(_STRETCHES) >= _MEMO_LIMIT:
        _STRETCHES.clear()
    for day in range(first, last + 1):
        _STRETCHES[(zone, day)] = stretch
    return stretch


def _naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def _day_start(ordinal: int) -> datetime:
    return datetime.combine(date.fromordinal(ordinal), time())


def _days_end(ordinal: int) -> datetime:
    """The wall time just after local day ``ordinal`` (its last microsecond on date.max)."""
    if ordinal >= date.max.toordinal():
        return datetime.max
    return _day_start(ordinal + 1)


_JUST_BEFORE = timedelta(microseconds=1)


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
        _require_aware(after)
        _require_aware(until)
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
        if _steady_local_offset(zone, today) is None:
            # `after` may sit in a repeated hour: instants after it can have
            # earlier wall times, so the whole stretch is walked on real time.
            stretch = _stretch(zone, today)
            yield from self._across(stretch, after, until)
            cursor = datetime.combine(date.fromordinal(stretch.last_day), time(23, 59))
        while True:
            day = -1
            offset: timedelta | None = None
            for naive in self.cron.slots_after(cursor, last_day):
                ordinal = naive.toordinal()
                if ordinal != day:
                    day, offset = ordinal, _steady_local_offset(zone, ordinal)
                if offset is None:
                    stretch = _stretch(zone, ordinal)
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

    def _across(self, stretch: _Stretch, after: datetime, until: datetime) -> Iterator[datetime]:
        """The instants in ``(after, until]`` of the slots on a stretch's days, increasing.

        Real time, segment by segment: a slot whose wall time a segment holds
        is the instant ``wall - offset`` there, so a wildcard schedule fires at
        both passes of a repeated hour and at nothing in a skipped one. A
        fixed time follows ``dst``: a skipped slot runs at the change (shift)
        or not (skip); a repeated one in the first pass, the second, or both.
        """
        bounds, offsets = stretch.bounds, stretch.offsets
        days_lo, days_hi = _day_start(stretch.first_day), _days_end(stretch.last_day)
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
            cursor = max(lo - _JUST_BEFORE, _naive(last + offset))
            for naive in self.cron.slots_after(cursor, hi.date()):
                if naive >= hi:
                    break
                instant = (naive - offset).replace(tzinfo=UTC)
                if instant > until:
                    return
                if instant > last:
                    last = instant
                    yield instant

    def _shifted_into(self, stretch: _Stretch, i: int) -> bool:
        """Whether fixed-time slots the gap starting segment ``i`` skips run at its start."""
        if not self.fixed_time or i == 0 or self.dst.gap is not DstGap.SHIFT:
            return False
        start, before, offset = stretch.bounds[i], stretch.offsets[i - 1], stretch.offsets[i]
        if before >= offset:
            return False
        lo = max(_naive(start + before), _day_start(stretch.first_day))
        return self._any_slot(lo, min(_naive(start + offset), _days_end(stretch.last_day)))

    def _walls_run(self, stretch: _Stretch, i: int) -> tuple[datetime, datetime]:
        """The wall times ``[lo, hi)`` whose slots run in segment ``i``.

        All the segment holds, but for a fixed time in a repeated stretch of
        wall clock: ``first`` leaves out the walls that ran before the change
        that starts the segment, ``last`` those that come again after the
        change that ends it.
        """
        bounds, offsets = stretch.bounds, stretch.offsets
        offset = offsets[i]
        lo, hi = _naive(bounds[i] + offset), _naive(bounds[i + 1] + offset)
        if not self.fixed_time:
            return lo, hi
        if i > 0 and offsets[i - 1] > offset and self.dst.fold is DstFold.FIRST:
            lo = _naive(bounds[i] + offsets[i - 1])
        if i + 1 < len(offsets) and offsets[i + 1] < offset and self.dst.fold is DstFold.LAST:
            hi = _naive(bounds[i + 1] + offsets[i + 1])
        return lo, hi

    def _any_slot(self, lo: datetime, hi: datetime) -> bool:
        """Whether a slot has a wall time in ``[lo, hi)``."""
        if lo >= hi:
            return False
        slot = next(self.cron.slots_after(lo - _JUST_BEFORE, hi.date()), None)
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

    def _stretches(self, after: datetime, until: datetime) -> Iterator[_Stretch]:
        zone = self.zone
        day = after.astimezone(zone).toordinal() - 1
        final = until.astimezone(zone).toordinal() + 1
        while day <= final:
            if _steady_local_offset(zone, day) is not None:
                day += 1
                continue
            stretch = _stretch(zone, day)
            yield stretch
            day = stretch.last_day + 1

    def _notes(self, stretch: _Stretch) -> Iterator[DstNote]:
        fixed, policy = self.fixed_time, self.dst
        days_lo, days_hi = _day_start(stretch.first_day), _days_end(stretch.last_day)
        for i in range(1, len(stretch.offsets)):
            at, before, offset = stretch.bounds[i], stretch.offsets[i - 1], stretch.offsets[i]
            gap = before < offset
            lo = max(_naive(at + min(before, offset)), days_lo)
            hi = min(_naive(at + max(before, offset)), days_hi)
            if lo >= hi:
                continue
            for wall in self.cron.slots_after(lo - _JUST_BEFORE, hi.date()):
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
        _require_aware(self.anchor)

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        _require_aware(after)
        _require_aware(until)
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

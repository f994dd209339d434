"""Time zones for schedule math: wall time to instants, the days a change of offset touches, DST.

Pure (zoneinfo and datetime only). A local day whose UTC offset holds all
around it maps every wall time to one instant by one subtraction
(``steady_local_offset``); the days near an offset change form a ``Stretch``,
walked on real time segment by segment by :class:`actors.domain.schedule.CronSchedule`,
which applies a fixed-time schedule's :class:`DstPolicy` there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from actors.domain import defaults
from actors.domain.errors import InvalidSchedule


def load_zone(name: str) -> ZoneInfo:
    """An IANA zone, or InvalidSchedule naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidSchedule(
            f"unknown time zone {name!r} (expected an IANA name such as 'Europe/Berlin' or 'UTC')"
        ) from exc


def require_aware(value: datetime) -> None:
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


def steady_utc_offset(zone: ZoneInfo, ordinal: int) -> timedelta | None:
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


def steady_local_offset(zone: ZoneInfo, ordinal: int) -> timedelta | None:
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
        around = {steady_utc_offset(zone, ordinal + d) for d in (-1, 0, 1)}
        if len(around) == 1:
            value = around.pop()
    if len(_STEADY_LOCAL_DAYS) >= _MEMO_LIMIT:
        _STEADY_LOCAL_DAYS.clear()
    _STEADY_LOCAL_DAYS[key] = value
    return value


@dataclass(frozen=True)
class Stretch:
    """Consecutive local days whose wall times are not all one instant each, and their offsets.

    Segment ``i`` is the real time ``[bounds[i], bounds[i + 1])``, all at
    ``offsets[i]``; a wall time of the days ``first_day``..``last_day`` is
    the instant ``wall - offsets[i]`` in each segment whose walls hold it.
    """

    first_day: int
    last_day: int
    bounds: tuple[datetime, ...]
    offsets: tuple[timedelta, ...]


_STRETCHES: dict[tuple[ZoneInfo, int], Stretch] = {}
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


def stretch_around(zone: ZoneInfo, ordinal: int) -> Stretch:
    """The run of unsteady local days around ``ordinal`` (an unsteady day), memoized."""
    found = _STRETCHES.get((zone, ordinal))
    if found is not None:
        return found
    first = last = ordinal
    low, high = date.min.toordinal() + 1, date.max.toordinal() - 2
    while first > low and ordinal - first < _STRETCH_DAYS:
        if steady_local_offset(zone, first - 1) is not None:
            break
        first -= 1
    while last < high and last - ordinal < _STRETCH_DAYS:
        if steady_local_offset(zone, last + 1) is not None:
            break
        last += 1
    start = _clamped(datetime.combine(date.fromordinal(first), time(), UTC), -_WALL_REACH)
    end = _clamped(datetime.combine(date.fromordinal(last), time(), UTC), _WALL_REACH * 2)
    bounds, offsets = _segments(zone, start, end)
    stretch = Stretch(first, last, bounds, offsets)
    if len(_STRETCHES) >= _MEMO_LIMIT:
        _STRETCHES.clear()
    for day in range(first, last + 1):
        _STRETCHES[(zone, day)] = stretch
    return stretch


def wall_time(moment: datetime) -> datetime:
    """An instant's wall-clock reading: the aware datetime with its zone dropped."""
    return moment.replace(tzinfo=None)


def day_start(ordinal: int) -> datetime:
    return datetime.combine(date.fromordinal(ordinal), time())


def days_end(ordinal: int) -> datetime:
    """The wall time just after local day ``ordinal`` (its last microsecond on date.max)."""
    if ordinal >= date.max.toordinal():
        return datetime.max
    return day_start(ordinal + 1)


JUST_BEFORE = timedelta(microseconds=1)


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

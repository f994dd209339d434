"""Schedules: which instants a job is due at. Pure, DST-correct, replica-independent.

The DST rule (documented in docs/scheduling.md):

* Cron expressions (read by :mod:`actors.domain.cron`) are evaluated on the
  job's local wall clock (IANA zone).
* A wall-clock time that does not exist (spring forward) fires once, at the
  next instant that exists (the end of the gap). Several slots in one gap fire
  once between them.
* A wall-clock time that happens twice (fall back) fires once, at its first
  occurrence.
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
    """Map a local wall-clock time to the UTC instant the DST rule says it fires at."""
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


@dataclass(frozen=True)
class CronSchedule:
    """A five-field cron expression evaluated in an IANA time zone.

    The expression is read by :mod:`actors.domain.cron` (crontab(5) rules, not
    croniter's); this class adds the zone and the DST rule.
    """

    expression: str
    timezone: str = defaults.TIMEZONE

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

    def fire_times(self, after: datetime, until: datetime) -> Iterator[datetime]:
        _require_aware(after)
        _require_aware(until)
        zone = self.zone
        # Iterate on the naive local wall clock, then map each slot to an
        # instant with the DST rule above (gap -> its end, repeated -> first).
        # On a local day whose UTC offset holds all around it (most days of
        # every zone) a slot maps by one subtraction; only days near a
        # transition take the zone conversions of local_to_instant.
        after_local = after.astimezone(zone).replace(tzinfo=None)
        # Start two hours early when a transition is near: the slot just after
        # `after` may sit in a repeated hour whose first occurrence is before
        # `after` in naive terms. On a steady day there is no repeated hour.
        early = after_local - timedelta(hours=2)
        steady = (
            _steady_local_offset(zone, after_local.toordinal()) is not None
            and _steady_local_offset(zone, early.toordinal()) is not None
        )
        start_local = after_local if steady else early
        # No slot two days past `until`'s wall clock can map to an instant at or
        # before `until` (UTC offsets differ by at most 26 hours), so stop there
        # rather than search on for a sparse expression's next slot.
        until_day = until.astimezone(zone).date()
        last_day = (
            until_day + timedelta(days=2) if until_day < date.max - timedelta(days=2) else date.max
        )
        last: datetime | None = None
        day = -1
        offset: timedelta | None = None
        for naive in self.cron.slots_after(start_local, last_day):
            ordinal = naive.toordinal()
            if ordinal != day:
                day, offset = ordinal, _steady_local_offset(zone, ordinal)
            if offset is not None:
                instant = (naive - offset).replace(tzinfo=UTC)
            else:
                instant = local_to_instant(naive, zone)
            if instant > until:
                return
            if instant <= after or instant == last:
                continue
            last = instant
            yield instant

    def describe(self) -> str:
        return f"cron {self.expression!r} in {self.timezone}"


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

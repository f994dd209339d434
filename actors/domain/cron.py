"""Cron expressions: our own small parser and matcher, with crontab(5) as the reference.

Why not croniter: croniter 5 and later read a single-value range ``N-N`` as
``*`` (``0 9-9 * * *`` fires every hour instead of once a day), and croniter
7.0.0 applies the day-of-month/day-of-week rule unlike cron for fields that
start with ``*`` (``0 0 */2 * 0`` fires on odd days OR Sundays; cron: odd days
that are Sundays). Normalising its input would still leave us depending on how
each version reads the rest. A scheduler must fire what the expression says
whatever version a user's resolver picks, so claimd parses and matches cron
itself: a few hundred lines, pure, tested against an independent evaluator
(cronsim) in a differential property test. croniter is no longer a dependency.

The accepted syntax ("Cron rules" in docs/scheduling.md says the same):

* Five fields separated by whitespace: minute (0-59), hour (0-23),
  day-of-month (1-31), month (1-12) and day-of-week (0-7; 0 and 7 are Sunday).
* A field is a comma-separated list of items; an item is ``*``, a number
  ``N``, a range ``A-B`` (``A <= B``; ``9-9`` is the single value 9), or a
  stepped ``*/S`` or ``A-B/S`` (every S-th value from the start of the range;
  S from 1 to the number of values in the field).
* Month names ``JAN``-``DEC`` and weekday names ``SUN``-``SAT`` in any case,
  wherever a number of that field may stand (``MON-FRI``, ``JAN,JUL``).
* ``@yearly`` (= ``@annually``), ``@monthly``, ``@weekly``, ``@daily``
  (= ``@midnight``) and ``@hourly``, as crontab(5) defines them.
* The day rule of crontab(5): when day-of-month and day-of-week are both
  restricted (neither starts with ``*``) a day matches if EITHER does;
  otherwise it must match both. ``*/7`` starts with ``*``, so it is not a
  restriction in this sense: ``0 0 1 * */7`` fires on the 1st only if it is a
  Sunday, exactly as cron does.

Refused, each with an InvalidSchedule naming the field and the problem:
``L``, ``W``, ``#``, ``?`` (Quartz extensions with no crontab(5) meaning), a
seconds or year field (six or seven fields), ``@reboot`` (a distributed
scheduler has no boot), a step on a single value (``5/15``: Vixie cron
silently drops the step, cronie refuses it, croniter and cronsim read
``5-59/15``; we refuse rather than pick one), out-of-range values, reversed
ranges (``5-3``), step 0 or a step larger than the field, empty list items,
and expressions that can never fire (``0 0 30 2 *``).

Fire times are found by skipping field by field (month, then day, then the
precomputed hour and minute lists), never by testing minute after minute, so
a sparse expression costs a few month steps and a dense one a tuple lookup per
slot. This module works on naive local wall-clock times; mapping a slot to an
instant (cron(8)'s DST rule, which depends on ``wildcard_time``) is
:class:`actors.domain.schedule.CronSchedule`'s job.
"""

from __future__ import annotations

import calendar
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime

from actors.domain.errors import InvalidSchedule

FIELD_ORDER = "minute hour day-of-month month day-of-week"

MONTH_NAMES: Mapping[str, int] = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
WEEKDAY_NAMES: Mapping[str, int] = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}

# crontab(5)'s nicknames. @reboot is deliberately absent (refused below).
MACROS: Mapping[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# The longest each month can be (February 29 exists in leap years).
LONGEST_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int]

    @property
    def span(self) -> int:
        """How many distinct values the field has (day-of-week: 7, its 7 is Sunday again)."""
        return 7 if self.name == "day-of-week" else self.high - self.low + 1


MINUTE = _Field("minute", 0, 59, {})
HOUR = _Field("hour", 0, 23, {})
DAY_OF_MONTH = _Field("day-of-month", 1, 31, {})
MONTH = _Field("month", 1, 12, MONTH_NAMES)
DAY_OF_WEEK = _Field("day-of-week", 0, 7, WEEKDAY_NAMES)  # 7 is Sunday again
FIELDS = (MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK)


class _FieldError(Exception):
    """A problem in one field; parse_cron adds the expression and the field."""


@dataclass(frozen=True)
class CronExpression:
    """A parsed five-field cron expression: the values each field allows."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]  # day-of-month, 1-31
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday (7 already folded into 0)
    either_day: bool  # both day fields restricted: a day matches if either does
    # cron(8)'s DST class: the minute or the hour field starts with '*' (as
    # cronsim reads it). Such a schedule fires at every real instant that
    # matches; one with both fixed is a "fixed time" (actors.domain.schedule).
    wildcard_time: bool = False

    def matches(self, wall: datetime) -> bool:
        """Whether a local wall-clock time (seconds ignored) is one of the expression's slots."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self._day_matches(wall.day, _cron_weekday(wall.date()))
        )

    def slots_after(self, after: datetime, last_day: date | None = None) -> Iterator[datetime]:
        """Naive wall-clock slots strictly after naive ``after``, increasing.

        Ends after ``last_day`` if given, else past year 9999. Skips by field:
        months that do not match cost one step, days that do not match one
        test, and each matching day yields its precomputed hour x minute slots.
        """
        start = after.date()
        cutoff = (after.hour, after.minute)  # a slot is hh:mm:00, so (h, m) > cutoff
        for day in self._dates_from(start, last_day or date.max):
            y, mo, d = day.year, day.month, day.day
            if day == start:
                for h in self.hours:
                    if h < cutoff[0]:
                        continue
                    for m in self.minutes:
                        if (h, m) > cutoff:
                            yield datetime(y, mo, d, h, m)
                continue
            for h in self.hours:
                for m in self.minutes:
                    yield datetime(y, mo, d, h, m)

    def explain(self) -> str:
        """What the expression fires at, field by field, with the day rule spelled out."""
        days_full = len(self.days) == DAY_OF_MONTH.span
        weekdays_full = len(self.weekdays) == DAY_OF_WEEK.span
        days, weekdays = _compact(self.days, DAY_OF_MONTH), _compact(self.weekdays, DAY_OF_WEEK)
        rule = ""
        if self.either_day and (days_full or weekdays_full):
            days = weekdays = "*"  # one side matches every day, so every day matches
        elif not (days_full or weekdays_full):
            rule = (
                "; a day matches if day-of-month OR day-of-week does"
                if self.either_day
                else "; a day must match day-of-month AND day-of-week"
            )
        return (
            f"minute {_compact(self.minutes, MINUTE)}; hour {_compact(self.hours, HOUR)}; "
            f"day-of-month {days}; month {_compact(self.months, MONTH)}; "
            f"day-of-week {weekdays}{rule}"
        )

    def _day_matches(self, day: int, weekday: int) -> bool:
        if self.either_day:
            return day in self.days or weekday in self.weekdays
        return day in self.days and weekday in self.weekdays

    def _dates_from(self, start: date, last: date) -> Iterator[date]:
        """Dates from ``start`` to ``last`` that match month and the day rule, increasing."""
        year = start.year
        while year <= last.year:
            for month in self.months:
                if year == start.year and month < start.month:
                    continue
                if (year, month) > (last.year, last.month):
                    return
                first = start.day if (year, month) == (start.year, start.month) else 1
                monday_based, length = calendar.monthrange(year, month)
                weekday_of_first = (monday_based + 1) % 7  # cron: 0 = Sunday
                if (year, month) == (last.year, last.month):
                    length = min(length, last.day)
                for d in range(first, length + 1):
                    if self._day_matches(d, (weekday_of_first + d - 1) % 7):
                        yield date(year, month, d)
            year += 1


# Parsed expressions by their text: thousands of jobs on "* * * * *" share one
# (a CronExpression is frozen). Weak: an expression no job uses is forgotten.
_PARSED: weakref.WeakValueDictionary[str, CronExpression] = weakref.WeakValueDictionary()


def parse_cron(expression: str) -> CronExpression:
    """The expression read by the rules above, or InvalidSchedule naming the problem.

    Equal texts give the same object (see ``_PARSED``).
    """
    cron = _PARSED.get(expression)
    if cron is None:
        cron = _parse_cron(expression)
        _PARSED[expression] = cron
    return cron


def _parse_cron(expression: str) -> CronExpression:
    text = expression.strip()
    if text.startswith("@"):
        return _parse_macro(expression, text)
    parts = text.split()
    if len(parts) != len(FIELDS):
        extra = " (a seconds or year field is not supported)" if len(parts) in (6, 7) else ""
        raise InvalidSchedule(
            f"invalid cron expression {expression!r}: it has {len(parts)} "
            f"fields; claimd reads five: {FIELD_ORDER}{extra}"
        )
    values: list[frozenset[int]] = []
    for field, part in zip(FIELDS, parts, strict=True):
        try:
            values.append(_parse_field(field, part))
        except _FieldError as exc:
            raise InvalidSchedule(
                f"invalid cron expression {expression!r}: {field.name} {part!r}: {exc}"
            ) from None
    minutes, hours, days, months, weekdays = values
    cron = CronExpression(
        text=expression,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=tuple(sorted(months)),
        weekdays=frozenset(w % 7 for w in weekdays),
        # crontab(5): a field is restricted unless its text starts with '*'.
        either_day=not (parts[2].startswith("*") or parts[4].startswith("*")),
        wildcard_time=parts[0].startswith("*") or parts[1].startswith("*"),
    )
    _require_a_date(cron)
    return cron


def _parse_macro(expression: str, text: str) -> CronExpression:
    name = text.lower()
    if name == "@reboot":
        raise InvalidSchedule(
            f"invalid cron expression {expression!r}: @reboot is not "
            "supported (claimd fires on the clock, not at start-up)"
        )
    if name not in MACROS:
        raise InvalidSchedule(
            f"invalid cron expression {expression!r}: unknown nickname; "
            f"claimd knows {', '.join(MACROS)}"
        )
    cron = parse_cron(MACROS[name])
    return CronExpression(
        expression,
        cron.minutes,
        cron.hours,
        cron.days,
        cron.months,
        cron.weekdays,
        cron.either_day,
        cron.wildcard_time,
    )


def _parse_field(field: _Field, text: str) -> frozenset[int]:
    out: set[int] = set()
    for item in text.split(","):
        out.update(_parse_item(field, item))
    return frozenset(out)


def _parse_item(field: _Field, item: str) -> range:
    if item == "":
        raise _FieldError("an empty list item")
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        step = _step(field, step_text)
    if base == "*":
        return range(field.low, field.high + 1, step)
    start_text, dash, end_text = base.partition("-")
    if not dash:
        value = _value(field, base)
        if slash:
            raise _FieldError(
                f"a step needs a range or '*' (write {value}-{field.high}/{step} or */{step})"
            )
        return range(value, value + 1)
    start, end = _value(field, start_text), _value(field, end_text)
    if start > end:
        raise _FieldError(f"the range {base} is reversed (its start is after its end)")
    return range(start, end + 1, step)


def _step(field: _Field, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise _FieldError(f"the step {text!r} is not a number")
    step = int(text)
    if step == 0:
        raise _FieldError("a step of 0 is not allowed")
    if step > field.span:
        raise _FieldError(f"the step {step} is larger than the field ({field.span} values)")
    return step


def _value(field: _Field, token: str) -> int:
    if token.isascii() and token.isdigit():
        number = int(token)
        if not field.low <= number <= field.high:
            raise _FieldError(f"{number} is out of range ({field.low}-{field.high})")
        return number
    named = field.names.get(token.upper())
    if named is not None:
        return named
    raise _FieldError(_unsupported(field, token))


def _unsupported(field: _Field, token: str) -> str:
    """Why a token is neither a number nor a name, naming the extension if it is one."""
    upper = token.upper()
    if "#" in upper:
        return "'#' (nth weekday of the month) is not supported"
    if "?" in upper:
        return "'?' is not supported (write '*')"
    if upper == "LW":
        return "'LW' (last weekday of the month) is not supported"
    if upper == "W" or (upper.endswith("W") and upper[:-1].isdigit()):
        return "'W' (nearest weekday) is not supported"
    if upper == "L" or (
        upper.endswith("L") and (upper[:-1].isdigit() or upper[:-1] in field.names)
    ):
        return "'L' (last day) is not supported"
    if token == "":
        return "a number is missing"
    if field.names:
        kind, names = ("month", "JAN-DEC") if field is MONTH else ("weekday", "SUN-SAT")
        return f"{token!r} is neither a number nor a {kind} name ({names})"
    return f"{token!r} is not a number"


def _require_a_date(cron: CronExpression) -> None:
    """Refuse an expression that can never fire (``0 0 30 2 *``).

    Under the OR rule any restricted weekday occurs every month. Under AND,
    a day-of-month that exists in one of the months is enough: every calendar
    date (February 29 included) falls on every weekday within a few decades.
    """
    if cron.either_day:
        return
    if not any(day <= LONGEST_MONTH[month] for month in cron.months for day in cron.days):
        raise InvalidSchedule(
            f"cron expression {cron.text!r} never fires (none of its "
            "months has any of its days of the month)"
        )


def _cron_weekday(day: date) -> int:
    return (day.weekday() + 1) % 7  # Python: Monday = 0; cron: Sunday = 0


def _compact(values: frozenset[int] | tuple[int, ...], field: _Field) -> str:
    """``{0, 1, 2, 3, 30}`` -> ``'0-3,30'``; every value of the field -> ``'*'``."""
    ordered = sorted(values)
    if len(ordered) == field.span:
        return "*"
    runs: list[str] = []
    start = prev = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        runs.append(
            str(start)
            if start == prev
            else f"{start},{prev}"
            if prev == start + 1
            else f"{start}-{prev}"
        )
        if value is not None:
            start = prev = value
    return ",".join(runs)

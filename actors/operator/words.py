"""A schedule in words, for the status page: "every day at 02:00", "every 30 seconds".

Only the common shapes are put in words; anything else is shown as the cron
expression itself, which is never wrong. The zone is shown beside it.
"""

from __future__ import annotations

import re
from datetime import timedelta

from actors.domain.cron import MACROS
from actors.domain.schedule import CronSchedule, IntervalSchedule

DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
NAMES = {d[:3].lower(): i for i, d in enumerate(DAYS)}
_NUMBER = re.compile(r"\d{1,2}")


def _plural(n: int, unit: str) -> str:
    return f"every {unit}" if n == 1 else f"every {n} {unit}s"


def interval_words(every: timedelta) -> str:
    """``every 30 seconds``, ``every 15 minutes``, ``every 2 hours``."""
    total = every.total_seconds()
    for size, unit in ((86_400, "day"), (3_600, "hour"), (60, "minute"), (1, "second")):
        if total >= size and total % size == 0:
            return _plural(int(total // size), unit)
    return f"every {int(total * 1000)} ms"


def _day(text: str) -> int | None:
    if _NUMBER.fullmatch(text):
        value = int(text)
        return value % 7 if value <= 7 else None
    return NAMES.get(text.lower())


def _weekdays(field: str) -> str | None:
    if field in ("1-5", "mon-fri", "MON-FRI"):
        return "Monday to Friday"
    days = [_day(part) for part in field.split(",")]
    if not days or any(d is None for d in days):
        return None
    return ", ".join(DAYS[d] for d in days if d is not None)


def cron_words(expression: str) -> str:
    """Common cron shapes in words; anything else as ``cron '<expression>'``."""
    fields = MACROS.get(expression.strip().lower(), expression).split()
    fallback = f"cron '{expression}'"
    if len(fields) != 5:
        return fallback
    minute, hour, dom, month, dow = fields
    if month != "*":
        return fallback
    if (minute, hour, dom, dow) == ("*", "*", "*", "*"):
        return "every minute"
    step = re.fullmatch(r"\*/(\d+)", minute)
    if step and (hour, dom, dow) == ("*", "*", "*"):
        return _plural(int(step[1]), "minute")
    if not _NUMBER.fullmatch(minute):
        return fallback
    if (hour, dom, dow) == ("*", "*", "*"):
        return f"every hour at :{int(minute):02d}"
    step = re.fullmatch(r"\*/(\d+)", hour)
    if step and (dom, dow) == ("*", "*"):
        return f"{_plural(int(step[1]), 'hour')} at :{int(minute):02d}"
    if not _NUMBER.fullmatch(hour):
        return fallback
    at = f"at {int(hour):02d}:{int(minute):02d}"
    if (dom, dow) == ("*", "*"):
        return f"every day {at}"
    if dom == "*":
        days = _weekdays(dow)
        return f"every {days} {at}" if days else fallback
    if dow == "*" and _NUMBER.fullmatch(dom):
        return f"on day {int(dom)} of every month {at}"
    return fallback


def schedule_words(schedule: CronSchedule | IntervalSchedule) -> str:
    """The schedule as an operator would say it (the zone is given apart)."""
    if isinstance(schedule, IntervalSchedule):
        return interval_words(schedule.every)
    return cron_words(schedule.expression)

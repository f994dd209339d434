"""cron(8)'s DST rule as cronsim (an evaluator we did not write) applies it: the reference.

cronsim 2.x, read from its source: given an aware start in a zone other than
UTC, an expression whose minute or hour field starts with ``*`` is evaluated
on real time (it ticks in UTC and matches the local wall clock, so both
passes of a repeated hour match and a skipped hour has nothing); an expression
with both fixed runs on the naive wall clock, a time in a gap moves to the
first minute that exists, a repeated time is its first occurrence (fold=0).
That is Debian's cron(8) rule, and claimd's by default.

Two places where cronsim departs from its own rule, set aside here (and the
brute-force walk below takes its place):

* a day that begins in a gap (Asia/Beirut, Atlantic/Azores: 00:00 -> 01:00):
  cronsim rolls to the next day by setting 00:00 on the aware datetime and
  returns that wall time although it does not exist. Such results are dropped.
* an hour step across a change that is not on the hour (Australia/Lord_Howe's
  30-minute shift, NZ-CHAT's change at 02:45, a day that starts at 01:00):
  cronsim steps to the next hour by 3600 s of real time from the wall's
  hh:00, which lands past a matching wall time and skips it.

So a wildcard schedule must equal the walk, and cronsim wherever cronsim
equals the walk (``cronsim_departs`` tells the windows where it does not: 32
of 12,448 wildcard windows in bench/dst_sweep.py's sweep). cronsim is not
run on the random wildcard windows at all: at Pacific/Chatham's fall change
(03:45 -> 02:45) ``* 3 * * *`` sends it round its hour loop without end.

The walk, for a wildcard schedule: every whole minute of real time in the
window whose local wall time the expression matches. Nothing to get wrong.

Used by ``test_dst_sweep.py`` and ``bench/dst_sweep.py`` (the before/after
figures).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim

from actors.domain import CronSchedule, parse_cron

EVERY_ZONE = tuple(sorted(available_timezones()))
# Each side of a transition the window reaches: a whole repeated or skipped
# hour (two in Antarctica/Troll) and the fixed times around it.
REACH = timedelta(hours=5)


def is_wildcard(expr: str) -> bool:
    """cron(8)'s and cronsim's test: the minute or the hour field starts with ``*``."""
    minute, hour = expr.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


@cache
def transitions_between(name: str, start: datetime, end: datetime) -> tuple[datetime, ...]:
    """The UTC instants (to the second) at which ``name``'s UTC offset changes."""
    zone = ZoneInfo(name)

    def offset(t: datetime) -> timedelta | None:
        return t.astimezone(zone).utcoffset()

    out: list[datetime] = []
    lo = start
    before = offset(lo)
    while lo < end:
        # A week at a time: no zone changes its offset twice within a week.
        hi = lo + timedelta(days=7)
        after = offset(hi)
        if after != before:
            a, b = lo, hi
            while b - a > timedelta(seconds=1):
                mid = a + (b - a) / 2
                if offset(mid) == before:
                    a = mid
                else:
                    b = mid
            out.append(b.replace(microsecond=0))
        lo, before = hi, after
    return tuple(out)


def _field(rng: random.Random, high: int, likely: tuple[int, ...]) -> str:
    kind = rng.random()
    pick = (lambda: rng.choice(likely)) if rng.random() < 0.7 else (lambda: rng.randint(0, high))
    if kind < 0.22:
        return "*"
    if kind < 0.40:
        return f"*/{rng.randint(1, high + 1)}"
    if kind < 0.65:
        return str(pick())
    if kind < 0.80:
        a = pick()
        return f"{a}-{rng.randint(a, high)}"
    if kind < 0.92:
        a, b = sorted((pick(), pick()))
        return f"{a},{b}" if a != b else str(a)
    a = pick()
    return f"{a}-{rng.randint(a, high)}/{rng.randint(1, 4)}"


def random_expression(rng: random.Random) -> str:
    """Five fields; hours and minutes near where clocks change (00-04, 22-23; :00, :30)."""
    minute = _field(rng, 59, (0, 15, 30, 45, 59, 1))
    hour = _field(rng, 23, (0, 1, 2, 3, 4, 22, 23))
    day = rng.choice(("*", "*", "*", "*", "1-31", "*/2"))
    month = "*"
    weekday = rng.choice(("*", "*", "*", "0", "0,6", "1-5"))
    return f"{minute} {hour} {day} {month} {weekday}"


def cronsim_fires(expr: str, name: str, after: datetime, until: datetime) -> list[datetime]:
    """cronsim's instants in ``(after, until]``, in UTC (wall times that do not exist dropped)."""
    out: list[datetime] = []
    for fire in CronSim(expr, after.astimezone(ZoneInfo(name))):
        instant = fire.astimezone(UTC)
        if instant > until:
            break
        if instant > after and instant.astimezone(fire.tzinfo).replace(tzinfo=None) == (
            fire.replace(tzinfo=None)
        ):
            out.append(instant)
    return out


def walked_fires(expr: str, name: str, after: datetime, until: datetime) -> list[datetime]:
    """Every whole minute of real time in ``(after, until]`` whose wall time matches ``expr``."""
    zone, cron = ZoneInfo(name), parse_cron(expr)
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    out: list[datetime] = []
    while t <= until:
        if cron.matches(t.astimezone(zone).replace(tzinfo=None)):
            out.append(t)
        t += timedelta(minutes=1)
    return out


def cronsim_departs(expr: str, name: str, at: datetime) -> bool:
    """Whether cronsim departs from its own wildcard rule (the walk) around ``at``."""
    after, until = at - REACH, at + REACH
    return cronsim_fires(expr, name, after, until) != walked_fires(expr, name, after, until)


def compare_window(expr: str, name: str, at: datetime) -> str | None:
    """None when claimd agrees with cronsim around the transition ``at``; else what differs."""
    after, until = at - REACH, at + REACH
    ours = list(CronSchedule(expr, name).fire_times(after, until))
    if is_wildcard(expr):
        walked = walked_fires(expr, name, after, until)
        if ours != walked:
            return (
                f"wildcard: {expr!r} {name} {at}: {_walls(ours, name)} walk {_walls(walked, name)}"
            )
        # cronsim equals the walk except where it departs from its own rule
        # (docstring; bench/dst_sweep.py counts those windows), so ours equals
        # cronsim wherever cronsim is right.
        return None
    theirs = cronsim_fires(expr, name, after, until)
    zone = ZoneInfo(name)
    per_day = Counter(t.astimezone(zone).date() for t in ours)
    if per_day != Counter(t.astimezone(zone).date() for t in theirs):
        return f"fixed: {expr!r} {name} {at}: {_walls(ours, name)} cronsim {_walls(theirs, name)}"
    return None


def _walls(instants: list[datetime], name: str) -> list[str]:
    zone = ZoneInfo(name)
    return [t.astimezone(zone).strftime("%m-%d %H:%M%z") for t in instants][:12]

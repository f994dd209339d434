"""Differential test: claimd's cron fire times against cronsim, an evaluator we did not write.

Thousands of random five-field expressions (single-value ranges such as ``9-9``,
ranges, steps on ranges and on ``*``, lists, month and weekday names in any
case, 0 and 7 for Sunday, both day fields restricted or not) in random IANA
zones: the next fire times must be equal, instant for instant, or both
evaluators must refuse the expression as never firing.

The comparison stops at the zone's first UTC-offset change after the start:
what happens at a change (cron(8)'s DST rule, which both follow) is compared
around every change of every zone in test_dst_sweep.py, with the places
cronsim departs from its own rule set aside there. When a change is
close after the random start, the start moves past it, so zones with DST still
compare months of fire times.

cronsim's semantics, read from its source (cronsim 2.x): the day rule is
crontab(5)'s (AND when either day field starts with ``*``, otherwise OR);
``*`` on day-of-week spans 0-7 and 7 is Sunday; ``A-B/S`` and ``*/S`` take
every S-th value from the start of the range, as cron does. It departs from
crontab(5) and from claimd only in what it accepts beyond claimd's syntax, so
the generator below simply does not produce those forms:

* a step on a one-value range (``3-3/2``): cronsim reads ``3-23/2``, the bug
  croniter 5+ has without the step; crontab(5) reads ``{3}``. cronsim is
  handed ``3-3`` instead (the same set), claimd gets ``3-3/2``;
* a step on a single value (``5/15``): cronsim reads ``5-59/15``, Vixie cron
  ignores the step; claimd refuses it (tested in test_cron.py);
* ``L``, ``W``, ``#``, a sixth (seconds) field: cronsim supports them, claimd
  refuses them (test_cron.py);
* a step larger than the field (``*/90``): cronsim accepts it, claimd refuses;
* ``@daily`` and the other nicknames: cronsim has none (claimd's are tested
  against their five-field forms in test_cron.py).

Run with ``--hypothesis-show-statistics`` to see how many fire times each
example compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from zoneinfo import ZoneInfo, available_timezones

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from actors.domain import CronSchedule, InvalidSchedule, take

FIRES = 8  # fire times compared per example
HORIZON = timedelta(days=366 * 30)  # how far either evaluator may search for them
QUIET_SCAN = timedelta(days=366 * 10)
ZONES = sorted(available_timezones())
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True)
class Spec:
    """One field for the generator; strategies built once (building them per draw is slow)."""

    low: int
    high: int
    names: tuple[str, ...] = ()
    steps: int = 0  # how many values a step may span

    @cached_property
    def number(self) -> st.SearchStrategy[int]:
        return st.integers(min_value=self.low, max_value=self.high)

    @cached_property
    def width(self) -> st.SearchStrategy[int]:
        return st.integers(min_value=0, max_value=self.high - self.low)

    @cached_property
    def step(self) -> st.SearchStrategy[int]:
        return st.integers(min_value=1, max_value=self.steps)


MINUTE = Spec(0, 59, steps=60)
HOUR = Spec(0, 23, steps=24)
DAY_OF_MONTH = Spec(1, 31, steps=31)
MONTH = Spec(1, 12, MONTHS, steps=12)
DAY_OF_WEEK = Spec(0, 7, WEEKDAYS, steps=7)  # 7 is Sunday and has no name of its own
KINDS = ("value", "one-value-range", "range", "range-step", "one-value-range-step")
ANY_KIND = st.sampled_from(("star", "star-step", *KINDS))
RESTRICTED_KIND = st.sampled_from(KINDS)
SPELLING = st.sampled_from((str.upper, str.lower, str.capitalize))
TENTHS = st.integers(min_value=0, max_value=9)
MORE_ITEMS = st.integers(min_value=0, max_value=2)
THIRDS = st.integers(min_value=0, max_value=2)
COIN = st.booleans()


def value(draw: st.DrawFn, spec: Spec, number: int) -> str:
    """A number of the field, or its name in a random case."""
    if number - spec.low < len(spec.names) and draw(COIN):
        return draw(SPELLING)(spec.names[number - spec.low])
    return str(number)


def item(draw: st.DrawFn, spec: Spec, starred: bool = True) -> tuple[str, str]:
    """One list item as claimd gets it, and as cronsim gets it (see the module docstring)."""
    kind = draw(ANY_KIND if starred else RESTRICTED_KIND)
    if kind == "star":
        return "*", "*"
    if kind == "star-step":
        text = f"*/{draw(spec.step)}"
        return text, text
    a = draw(spec.number)
    if kind == "value":
        text = value(draw, spec, a)
        return text, text
    b = a if kind.startswith("one-value-range") else a + draw(spec.width) % (spec.high - a + 1)
    text = f"{value(draw, spec, a)}-{value(draw, spec, b)}"
    if not kind.endswith("step"):
        return text, text
    step = draw(spec.step)
    # cronsim reads a step on a one-value range like a step on a single value
    # (`3-3/2` as `3-23/2`), which crontab(5) does not: Vixie cron and cronie
    # fill the range 3-3 and step through it, giving {3}. claimd follows
    # crontab(5); cronsim is handed the same set without the no-op step.
    return f"{text}/{step}", (text if a == b else f"{text}/{step}")


def field(
    draw: st.DrawFn, spec: Spec, star_weight: int, restricted: bool = False
) -> tuple[str, str]:
    """A whole field: often a plain '*' (so the day rule meets both cases), else a list.

    ``restricted``: the field does not start with '*' (crontab(5)'s meaning).
    """
    if not restricted and draw(TENTHS) < star_weight:
        return "*", "*"
    pairs = [item(draw, spec, starred=not restricted)]
    pairs += [item(draw, spec) for _ in range(draw(MORE_ITEMS))]
    return ",".join(p[0] for p in pairs), ",".join(p[1] for p in pairs)


@st.composite
def expressions(draw: st.DrawFn) -> tuple[str, str]:
    """An expression for claimd, and the same expression spelled for cronsim.

    A third of them restrict both day fields, where crontab(5)'s OR rule applies.
    """
    both_days = draw(THIRDS) == 0
    parts = [
        field(draw, MINUTE, 2),
        field(draw, HOUR, 2),
        field(draw, DAY_OF_MONTH, 3, restricted=both_days),
        field(draw, MONTH, 5),
        field(draw, DAY_OF_WEEK, 3, restricted=both_days),
    ]
    return " ".join(p[0] for p in parts), " ".join(p[1] for p in parts)


def next_offset_change(zone: ZoneInfo, start: datetime, end: datetime) -> datetime:
    """A bound just before the zone's first UTC-offset change after ``start``.

    Scans by day, then bisects to within a minute and returns the side that
    still has the old offset, so that a fire time at the very instant of the
    change (the end of a gap) is never compared. ``end`` if nothing changes.
    """
    base = start.astimezone(zone).utcoffset()
    lo = start
    while lo < end:
        hi = min(lo + timedelta(days=1), end)
        if hi.astimezone(zone).utcoffset() != base:
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == base:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo = hi
    return end


def cronsim_fires(expr: str, after: datetime, zone: ZoneInfo, until: datetime) -> list[datetime]:
    out: list[datetime] = []
    for fire in CronSim(expr, after.astimezone(zone)):
        instant = fire.astimezone(UTC)
        if instant > until or len(out) == FIRES:
            break
        out.append(instant)
    return out


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spelled=expressions(),
    zone_name=st.sampled_from(ZONES),
    start=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2045, 12, 31)),
)
def test_claimd_and_cronsim_fire_at_the_same_instants(
    spelled: tuple[str, str], zone_name: str, start: datetime
) -> None:
    expr, for_cronsim = spelled
    zone = ZoneInfo(zone_name)
    after = start.replace(tzinfo=UTC)
    try:
        schedule: CronSchedule | None = CronSchedule(expr, zone_name)
        refusal = ""
    except InvalidSchedule as exc:
        schedule, refusal = None, str(exc)
    if schedule is None:
        # The only refusal the generator can meet: an expression that never fires.
        assert "never fires" in refusal, refusal
        with pytest.raises((CronSimError, StopIteration)):
            next(CronSim(for_cronsim, after.astimezone(zone)))
        event("both refuse: never fires")
        return

    # Away from DST: move a start that sits just before an offset change past it.
    change = next_offset_change(zone, after - timedelta(hours=3), after + timedelta(days=60))
    if change < after + timedelta(days=60):
        after = change + timedelta(days=1, minutes=start.minute)
        event("start moved past an offset change")

    until = after + HORIZON
    ours = take(schedule.fire_times(after, until), FIRES)
    theirs = cronsim_fires(for_cronsim, after, zone, until)
    last = max([*ours, *theirs], default=after)
    quiet_until = next_offset_change(
        zone, after - timedelta(hours=3), min(last + timedelta(minutes=1), after + QUIET_SCAN)
    )
    ours_quiet = [t for t in ours if t < quiet_until]
    theirs_quiet = [t for t in theirs if t < quiet_until]
    assert ours_quiet == theirs_quiet, (expr, for_cronsim, zone_name, after)
    compared = len(ours_quiet)
    event(f"fire times compared: {compared if compared < FIRES else f'all {FIRES}'}")
    event("day rule: " + ("OR" if schedule.cron.either_day else "AND"))
    if re.search(r"(?<![\w/])(\w+)-\1(?![\w])", expr.upper()):
        event("has a one-value range such as 9-9")


@pytest.mark.parametrize(
    "expr",
    [
        # "0 3-3/2 * * *" is not here: cronsim reads it as every two hours from 3 (docstring)
        "0 9-9 * * *",
        "0 0 1 12-12 *",
        "5-5 * * * *",
        "0 3-3 * * *",
        "0 0 1 * */7",
        "0 0 */2 * 0",
        "0 0 1,15 * MON",
        "*/7 1-23/5 * jan-MAR/2 Mon-fri",
        "0 12 29 2 *",
        "15 10 31 * 7",
        "0 0 * * 5-7",
        "0 0 31 4 MON",
    ],
)
@pytest.mark.parametrize("zone_name", ["UTC", "Etc/GMT-14", "Asia/Kolkata", "Asia/Kathmandu"])
def test_the_issues_examples_agree_with_cronsim_over_years(expr: str, zone_name: str) -> None:
    """Zones without DST in the years compared: one long comparison, no transition."""
    zone = ZoneInfo(zone_name)
    after = datetime(2025, 12, 31, 21, 17, tzinfo=UTC)
    until = datetime(2034, 1, 1, tzinfo=UTC)
    ours = take(CronSchedule(expr, zone_name).fire_times(after, until), 3000)
    theirs: list[datetime] = []
    for fire in CronSim(expr, after.astimezone(zone)):
        if fire.astimezone(UTC) > until or len(theirs) == 3000:
            break
        theirs.append(fire.astimezone(UTC))
    assert len(ours) >= 2
    assert ours == theirs


@pytest.mark.parametrize(
    "expr", ["0 0 30 2 *", "0 0 30,31 feb *", "0 0 31 4,6,9,11 *", "0 0 31 4 */7", "0 0 30-31 2 *"]
)
def test_both_refuse_an_expression_that_never_fires(expr: str) -> None:
    with pytest.raises(InvalidSchedule, match="never fires"):
        CronSchedule(expr)
    with pytest.raises(CronSimError):
        CronSim(expr, datetime(2026, 1, 1, tzinfo=UTC))

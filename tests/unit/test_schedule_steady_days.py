"""The steady-day shortcut of CronSchedule.fire_times against the zone-by-zone walk.

``fire_times`` maps a wall-clock slot to its instant by one subtraction on a
local day whose UTC offset holds all around it, and by ``local_to_instant``'s
zone conversions only near a transition. This test holds the shortcut to a
plain walk written out here: every slot through zoneinfo's ``fold`` (cron(8)'s
rule: every occurrence for a wildcard minute or hour; a fixed time once, its
first occurrence or the end of its gap). Ranges are drawn around the zones' real transitions
(spring forward, fall back, offset changes of whole days such as Samoa's in
2011), in every zone that has them, so both branches and their border run.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.domain import CronSchedule, take
from actors.domain.zones import local_to_instant

ZONES = (
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute DST shift
    "Pacific/Apia",  # skipped 2011-12-30 entirely
    "America/Santiago",  # DST changes at 24:00 local
    "Asia/Tehran",
    "Europe/Dublin",  # negative DST in tzdata
    "Antarctica/Troll",  # a two-hour DST shift
    "UTC",
)
EXPRESSIONS = (
    "* * * * *",
    "*/7 * * * *",
    "30 2 * * *",
    "0,30 0-3 * * *",
    "59 23 * * *",
    "0 0 * * *",
    "15 1 * 3,10 0",
    "0 */2 * * *",
)


def occurrences(wall: datetime, zone: ZoneInfo) -> list[datetime]:
    """The real instants whose wall time is ``wall``: none (skipped), one, or two (repeated)."""
    out: list[datetime] = []
    for fold in (0, 1):
        instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == wall and instant not in out:
            out.append(instant)
    return sorted(out)


def reference(schedule: CronSchedule, after: datetime, until: datetime) -> Iterator[datetime]:
    """Slot by slot through zoneinfo's folds, cron(8)'s rule, with the default dst policy.

    A wildcard minute or hour: every occurrence of every slot. A fixed time:
    the first occurrence, or for a skipped slot the end of the gap
    (``local_to_instant``), once.
    """
    zone = schedule.zone
    start_local = after.astimezone(zone).replace(tzinfo=None) - timedelta(days=2)
    last_day = until.astimezone(zone).date() + timedelta(days=2)
    found: set[datetime] = set()
    for naive in schedule.cron.slots_after(start_local, last_day):
        real = occurrences(naive, zone)
        if schedule.fixed_time:
            real = real[:1] or [local_to_instant(naive, zone)]
        found.update(t for t in real if after < t <= until)
    yield from sorted(found)


def transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    """The UTC instants (to the hour) at which the zone's offset changed in ``year``."""
    out: list[datetime] = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    previous = t.astimezone(zone).utcoffset()
    while t.year == year:
        t += timedelta(hours=1)
        offset = t.astimezone(zone).utcoffset()
        if offset != previous:
            out.append(t)
            previous = offset
    return out


AROUND = [
    (name, at)
    for name in ZONES
    for year in (2011, 2026)
    for at in transitions(ZoneInfo(name), year) or [datetime(year, 6, 1, tzinfo=UTC)]
]


@settings(max_examples=400, deadline=None)
@given(
    around=st.sampled_from(AROUND),
    expression=st.sampled_from(EXPRESSIONS),
    start_minutes=st.integers(min_value=-3 * 24 * 60, max_value=3 * 24 * 60),
    seconds=st.integers(min_value=0, max_value=59),
    span_minutes=st.integers(min_value=1, max_value=4 * 24 * 60),
)
def test_the_shortcut_fires_at_the_walks_instants(
    around: tuple[str, datetime],
    expression: str,
    start_minutes: int,
    seconds: int,
    span_minutes: int,
) -> None:
    name, at = around
    schedule = CronSchedule(expression, name)
    after = at + timedelta(minutes=start_minutes, seconds=seconds)
    until = after + timedelta(minutes=span_minutes)
    assert take(schedule.fire_times(after, until)) == take(reference(schedule, after, until))


@pytest.mark.parametrize("name", ZONES)
def test_a_whole_year_of_every_fifteen_minutes_agrees(name: str) -> None:
    schedule = CronSchedule("*/15 * * * *", name)
    after = datetime(2026, 1, 1, tzinfo=UTC) - timedelta(days=1)
    until = datetime(2027, 1, 1, tzinfo=UTC)
    assert take(schedule.fire_times(after, until)) == take(reference(schedule, after, until))


def test_a_day_that_a_zone_skipped_has_no_instants() -> None:
    """Samoa went from 2011-12-29 23:59 to 2011-12-31 00:00: its 30th has no wall time."""
    schedule = CronSchedule("0 12 * * *", "Pacific/Apia")
    after = datetime(2011, 12, 28, tzinfo=UTC)
    fired = take(schedule.fire_times(after, after + timedelta(days=4)))
    local_days = [t.astimezone(ZoneInfo("Pacific/Apia")).date() for t in fired]
    assert date(2011, 12, 30) not in local_days
    assert fired == take(reference(schedule, after, after + timedelta(days=4)))

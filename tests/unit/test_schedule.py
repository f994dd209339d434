"""Schedule math: DST-correct cron in IANA zones, anchored intervals, clear refusals."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.domain import CronSchedule, IntervalSchedule, InvalidSchedule, take
from actors.domain.schedule import EPOCH
from actors.domain.zones import local_to_instant
from tests.unit.dst_reference import walked_fires

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def fires(expr: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """Instants of ``expr`` after local ``start`` up to local ``end`` (naive, in ``zone``)."""
    z = ZoneInfo(zone)
    after = start.replace(tzinfo=z).astimezone(UTC)
    until = end.replace(tzinfo=z).astimezone(UTC)
    return list(CronSchedule(expr, zone).fire_times(after, until))


def walls(instants: list[datetime], zone: str) -> list[str]:
    """Local wall clock with its offset, e.g. ``'29 03:00+0200'``."""
    return [t.astimezone(ZoneInfo(zone)).strftime("%d %H:%M%z") for t in instants]


def day(y: int, m: int, d: int, hour: int = 0) -> datetime:
    return datetime(y, m, d, hour)


# -- the DST rule, case by case ------------------------------------------------------------

# (zone, DST day, expression, expected local walls from that day's 00:00 to 06:00)
SPRING_FORWARD = [
    # Berlin: 02:00 CET jumps to 03:00 CEST. The 02:00 slot does not exist: it
    # fires at the end of the gap, 03:00, which is also the 03:00 slot: one run.
    (
        BERLIN,
        (2026, 3, 29),
        "0 * * * *",
        ["29 01:00+0100", "29 03:00+0200", "29 04:00+0200", "29 05:00+0200", "29 06:00+0200"],
    ),
    (
        BERLIN,
        (2027, 3, 28),
        "0 * * * *",
        ["28 01:00+0100", "28 03:00+0200", "28 04:00+0200", "28 05:00+0200", "28 06:00+0200"],
    ),
    (
        BERLIN,
        (2026, 3, 29),
        "*/30 * * * *",
        [
            "29 00:30+0100",
            "29 01:00+0100",
            "29 01:30+0100",
            "29 03:00+0200",
            "29 03:30+0200",
            "29 04:00+0200",
            "29 04:30+0200",
            "29 05:00+0200",
            "29 05:30+0200",
            "29 06:00+0200",
        ],
    ),
    (
        NEW_YORK,
        (2026, 3, 8),
        "0 * * * *",
        ["08 01:00-0500", "08 03:00-0400", "08 04:00-0400", "08 05:00-0400", "08 06:00-0400"],
    ),
    (
        NEW_YORK,
        (2027, 3, 14),
        "*/30 * * * *",
        [
            "14 00:30-0500",
            "14 01:00-0500",
            "14 01:30-0500",
            "14 03:00-0400",
            "14 03:30-0400",
            "14 04:00-0400",
            "14 04:30-0400",
            "14 05:00-0400",
            "14 05:30-0400",
            "14 06:00-0400",
        ],
    ),
    (
        NEW_YORK,
        (2026, 3, 8),
        "*/30 * * * *",
        [
            "08 00:30-0500",
            "08 01:00-0500",
            "08 01:30-0500",
            "08 03:00-0400",
            "08 03:30-0400",
            "08 04:00-0400",
            "08 04:30-0400",
            "08 05:00-0400",
            "08 05:30-0400",
            "08 06:00-0400",
        ],
    ),
    # A wildcard minute in an hour that does not exist: no real instant matches
    # (cron(8); the rule before issue 22 fired it once at 03:00).
    (BERLIN, (2026, 3, 29), "*/15 2 * * *", []),
    (NEW_YORK, (2026, 3, 8), "*/15 2 * * *", []),
    # A wildcard hour: 02:30 does not exist, nothing fires in its place (it was
    # shifted to 03:00 before issue 22: an extra run).
    (
        BERLIN,
        (2026, 3, 29),
        "30 * * * *",
        ["29 00:30+0100", "29 01:30+0100", "29 03:30+0200", "29 04:30+0200", "29 05:30+0200"],
    ),
    # A fixed time: two slots inside one gap, none of them 03:00: they fire
    # once, at the end of the gap (dst.gap = shift, the default).
    (BERLIN, (2026, 3, 29), "0,30 2 * * *", ["29 03:00+0200"]),
    (NEW_YORK, (2026, 3, 8), "0,30 2 * * *", ["08 03:00-0400"]),
]

FALL_BACK = [
    # Berlin: 03:00 CEST falls back to 02:00 CET. 02:00-02:59 happens twice: a
    # wildcard minute or hour fires at both occurrences (+0200, then +0100).
    (
        BERLIN,
        (2026, 10, 25),
        "0 * * * *",
        [
            "25 01:00+0200",
            "25 02:00+0200",
            "25 02:00+0100",
            "25 03:00+0100",
            "25 04:00+0100",
            "25 05:00+0100",
            "25 06:00+0100",
        ],
    ),
    (
        BERLIN,
        (2027, 10, 31),
        "0 * * * *",
        [
            "31 01:00+0200",
            "31 02:00+0200",
            "31 02:00+0100",
            "31 03:00+0100",
            "31 04:00+0100",
            "31 05:00+0100",
            "31 06:00+0100",
        ],
    ),
    (
        BERLIN,
        (2026, 10, 25),
        "*/30 * * * *",
        [
            "25 00:30+0200",
            "25 01:00+0200",
            "25 01:30+0200",
            "25 02:00+0200",
            "25 02:30+0200",
            "25 02:00+0100",
            "25 02:30+0100",
            "25 03:00+0100",
            "25 03:30+0100",
            "25 04:00+0100",
            "25 04:30+0100",
            "25 05:00+0100",
            "25 05:30+0100",
            "25 06:00+0100",
        ],
    ),
    # New York: 02:00 EDT falls back to 01:00 EST; 01:00-01:59 repeats.
    (
        NEW_YORK,
        (2026, 11, 1),
        "0 * * * *",
        [
            "01 01:00-0400",
            "01 01:00-0500",
            "01 02:00-0500",
            "01 03:00-0500",
            "01 04:00-0500",
            "01 05:00-0500",
            "01 06:00-0500",
        ],
    ),
    (
        NEW_YORK,
        (2026, 11, 1),
        "*/30 * * * *",
        [
            "01 00:30-0400",
            "01 01:00-0400",
            "01 01:30-0400",
            "01 01:00-0500",
            "01 01:30-0500",
            "01 02:00-0500",
            "01 02:30-0500",
            "01 03:00-0500",
            "01 03:30-0500",
            "01 04:00-0500",
            "01 04:30-0500",
            "01 05:00-0500",
            "01 05:30-0500",
            "01 06:00-0500",
        ],
    ),
    (
        NEW_YORK,
        (2027, 11, 7),
        "*/30 * * * *",
        [
            "07 00:30-0400",
            "07 01:00-0400",
            "07 01:30-0400",
            "07 01:00-0500",
            "07 01:30-0500",
            "07 02:00-0500",
            "07 02:30-0500",
            "07 03:00-0500",
            "07 03:30-0500",
            "07 04:00-0500",
            "07 04:30-0500",
            "07 05:00-0500",
            "07 05:30-0500",
            "07 06:00-0500",
        ],
    ),
    (
        NEW_YORK,
        (2026, 11, 1),
        "*/15 1 * * *",
        [
            "01 01:00-0400",
            "01 01:15-0400",
            "01 01:30-0400",
            "01 01:45-0400",
            "01 01:00-0500",
            "01 01:15-0500",
            "01 01:30-0500",
            "01 01:45-0500",
        ],
    ),
    # A fixed time in the repeated hour fires once, at its first occurrence
    # (dst.fold = first, the default).
    (BERLIN, (2026, 10, 25), "0,30 2 * * *", ["25 02:00+0200", "25 02:30+0200"]),
]


@pytest.mark.parametrize(("zone", "date", "expr", "expected"), SPRING_FORWARD + FALL_BACK)
def test_dst_day_follows_cron8s_rule(
    zone: str, date: tuple[int, int, int], expr: str, expected: list[str]
) -> None:
    got = fires(expr, zone, day(*date), day(*date, hour=6))
    assert walls(got, zone) == expected
    # Instants, not only wall clocks, strictly increase.
    assert all(a < b for a, b in itertools.pairwise(got))


@pytest.mark.parametrize(
    ("zone", "date", "expected"),
    [
        # 02:30 does not exist on the spring day: it fires once at 03:00, then 02:30 again.
        (BERLIN, (2026, 3, 29), ["29 03:00+0200", "30 02:30+0200", "31 02:30+0200"]),
        (BERLIN, (2027, 3, 28), ["28 03:00+0200", "29 02:30+0200", "30 02:30+0200"]),
        (NEW_YORK, (2026, 3, 8), ["08 03:00-0400", "09 02:30-0400", "10 02:30-0400"]),
        (NEW_YORK, (2027, 3, 14), ["14 03:00-0400", "15 02:30-0400", "16 02:30-0400"]),
        # 02:30 happens twice on the fall day in Berlin: once, at the first (+0200).
        (BERLIN, (2026, 10, 25), ["25 02:30+0200", "26 02:30+0100", "27 02:30+0100"]),
        (BERLIN, (2027, 10, 31), ["31 02:30+0200", "01 02:30+0100", "02 02:30+0100"]),
        # In New York 02:30 is after the repeated hour: an ordinary day, in EST.
        (NEW_YORK, (2026, 11, 1), ["01 02:30-0500", "02 02:30-0500", "03 02:30-0500"]),
        (NEW_YORK, (2027, 11, 7), ["07 02:30-0500", "08 02:30-0500", "09 02:30-0500"]),
    ],
)
def test_daily_at_0230_across_dst(
    zone: str, date: tuple[int, int, int], expected: list[str]
) -> None:
    start = day(*date)
    got = fires("30 2 * * *", zone, start, start + timedelta(days=2, hours=23))
    assert walls(got, zone) == expected


def test_daily_in_new_yorks_repeated_hour_fires_at_the_first_occurrence() -> None:
    got = fires("30 1 * * *", NEW_YORK, day(2026, 10, 31), day(2026, 11, 2, 12))
    assert walls(got, NEW_YORK) == ["31 01:30-0400", "01 01:30-0400", "02 01:30-0500"]


@pytest.mark.parametrize(
    ("after_fold", "expected_next"),
    [
        # `after` in the first pass of the repeated hour: 02:30 is still to come.
        (0, "25 02:30+0200"),
        # `after` in the second pass: a wildcard minute fires there too (cron(8));
        # before issue 22 the next was 03:00.
        (1, "25 02:30+0100"),
    ],
)
def test_after_inside_the_repeated_hour(after_fold: int, expected_next: str) -> None:
    z = ZoneInfo(BERLIN)
    after = datetime(2026, 10, 25, 2, 15, tzinfo=z, fold=after_fold).astimezone(UTC)
    got = take(CronSchedule("*/30 * * * *", BERLIN).fire_times(after, after + timedelta(hours=3)))
    assert walls(got[:1], BERLIN) == [expected_next]
    assert all(t > after for t in got)


@pytest.mark.parametrize("zone", [BERLIN, NEW_YORK])
@pytest.mark.parametrize("year", [2026, 2027])
def test_hourly_for_a_whole_year_one_instant_per_real_occurrence(zone: str, year: int) -> None:
    z = ZoneInfo(zone)
    got = fires("0 * * * *", zone, datetime(year, 1, 1), datetime(year + 1, 1, 1))
    local = [t.astimezone(z).replace(tzinfo=None) for t in got]
    slots = [datetime(year, 1, 1, 1) + timedelta(hours=h) for h in range(365 * 24)]
    gap = [s for s in slots if not _exists(s, z)]
    # Exactly one slot a year (spring forward, 02:00) does not exist ...
    assert [g.month for g in gap] == [3]
    assert [g.hour for g in gap] == [2]
    # ... and fires nowhere; every other slot fires once, but the repeated
    # 01:00 or 02:00 (a wildcard hour), which fires at both of its occurrences.
    assert set(local) == set(slots) - set(gap)
    assert len(got) == 365 * 24 - 1 + 1
    assert all(a < b for a, b in itertools.pairwise(got))
    repeated = [wall for wall in set(local) if local.count(wall) > 1]
    assert len(repeated) == 1
    assert repeated[0].month in (10, 11)


# -- bounds: strictly after `after`, at most `until` ---------------------------------------


def test_cron_bounds_exclude_after_and_include_until() -> None:
    schedule = CronSchedule("*/5 * * * *")
    after = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)  # itself a fire time
    until = datetime(2026, 5, 1, 12, 20, tzinfo=UTC)  # itself a fire time
    got = list(schedule.fire_times(after, until))
    assert got == [after + timedelta(minutes=m) for m in (5, 10, 15, 20)]
    assert all(t.tzinfo is UTC for t in got)
    assert list(schedule.fire_times(until, until)) == []


def test_cron_accepts_after_in_another_zone_and_answers_in_utc() -> None:
    after = datetime(2026, 7, 1, 8, 0, tzinfo=ZoneInfo("Asia/Tokyo"))  # 23:00 UTC the day before
    got = take(CronSchedule("0 0 * * *").fire_times(after, after + timedelta(hours=2)))
    assert got == [datetime(2026, 7, 1, 0, 0, tzinfo=UTC)]


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        list(CronSchedule("* * * * *").fire_times(datetime(2026, 1, 1), datetime(2026, 1, 2)))
    with pytest.raises(ValueError, match="aware"):
        list(
            IntervalSchedule(timedelta(seconds=5)).fire_times(
                datetime(2026, 1, 1), datetime(2026, 1, 2)
            )
        )


# -- intervals: anchored, so every replica agrees ------------------------------------------


@pytest.mark.parametrize(
    "every",
    [timedelta(seconds=7), timedelta(milliseconds=1500), timedelta(minutes=45), timedelta(hours=5)],
)
def test_interval_instants_do_not_depend_on_when_they_are_computed(every: timedelta) -> None:
    schedule = IntervalSchedule(every)
    until = datetime(2026, 6, 2, tzinfo=UTC)
    early = take(schedule.fire_times(datetime(2026, 6, 1, 0, 0, 0, tzinfo=UTC), until))
    late = take(schedule.fire_times(datetime(2026, 6, 1, 7, 13, 29, 123456, tzinfo=UTC), until))
    assert late
    assert set(late) <= set(early)
    assert early[-len(late) :] == late
    # Every instant sits on the grid anchored at the epoch.
    step = every // timedelta(microseconds=1)
    assert all((t - EPOCH) // timedelta(microseconds=1) % step == 0 for t in early)


def test_interval_bounds_exclude_after_and_include_until() -> None:
    schedule = IntervalSchedule(timedelta(seconds=10))
    after = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)  # on the grid
    until = datetime(2026, 1, 1, 0, 0, 40, tzinfo=UTC)  # on the grid
    got = list(schedule.fire_times(after, until))
    assert got == [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (20, 30, 40)]
    off_grid = list(
        schedule.fire_times(after + timedelta(microseconds=1), until - timedelta(microseconds=1))
    )
    assert off_grid == [datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (20, 30)]


def test_interval_with_its_own_anchor() -> None:
    anchor = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)
    schedule = IntervalSchedule(timedelta(minutes=1), anchor=anchor)
    got = list(
        schedule.fire_times(
            datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 2, 1, 0, 3, tzinfo=UTC)
        )
    )
    assert got == [datetime(2026, 2, 1, 0, m, 3, tzinfo=UTC) for m in (0, 1, 2)]


@pytest.mark.parametrize("every", [timedelta(0), timedelta(seconds=-5), timedelta(microseconds=10)])
def test_interval_refuses_zero_negative_and_sub_millisecond(every: timedelta) -> None:
    with pytest.raises(InvalidSchedule, match="interval must be"):
        IntervalSchedule(every)


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "message"),
    [
        ("0 0 30 2 *", "UTC", "'0 0 30 2 \\*' never fires"),
        ("0 0 31 4 *", BERLIN, "never fires"),
        ("61 * * * *", "UTC", "invalid cron expression '61 \\* \\* \\* \\*'"),
        ("* * *", "UTC", "invalid cron expression"),
        ("every day", "UTC", "invalid cron expression 'every day'"),
        ("", "UTC", "invalid cron expression ''"),
        ("* * * * * *", "UTC", "a seconds or year field is not supported"),
        ("@reboot", "UTC", "@reboot is not supported"),
        ("0 2 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("0 2 * * *", "europe/berlin_typo", "unknown time zone"),
        ("0 2 * * *", "", "unknown time zone ''"),
        ("0 2 * * *", "../../etc/passwd", "unknown time zone"),
    ],
)
def test_bad_schedules_raise_invalid_schedule(expr: str, zone: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        CronSchedule(expr, zone)


def test_feb_29_is_possible() -> None:
    got = take(
        CronSchedule("0 0 29 2 *").fire_times(
            datetime(2026, 1, 1, tzinfo=UTC), datetime(2033, 1, 1, tzinfo=UTC)
        )
    )
    assert [t.year for t in got] == [2028, 2032]


# -- properties over random zones, expressions and dates -----------------------------------

ZONES = sorted(available_timezones())
MINUTES = ["0", "30", "*/15", "5,35", "59", "*/7"]
HOURS = ["*", "0", "1", "2", "3", "1-3", "*/6", "0,12"]
DAYS = ["*", "1", "15", "*/2"]
WEEKDAYS = ["*", "0", "1-5", "6"]


@st.composite
def cron_expressions(draw: st.DrawFn) -> str:
    return " ".join(
        [
            draw(st.sampled_from(MINUTES)),
            draw(st.sampled_from(HOURS)),
            draw(st.sampled_from(DAYS)),
            "*",
            draw(st.sampled_from(WEEKDAYS)),
        ]
    )


def _next_transition(zone: ZoneInfo, start: datetime) -> datetime | None:
    """The first instant within a year after ``start`` where the zone's offset changes."""

    def offset(t: datetime) -> timedelta | None:
        return t.astimezone(zone).utcoffset()

    lo = start
    for _ in range(370):
        hi = lo + timedelta(days=1)
        if offset(hi) != offset(lo):
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if offset(mid) == offset(lo):
                    lo = mid
                else:
                    hi = mid
            return hi
        lo = hi
    return None


def _is_gap_end(instant: datetime, zone: ZoneInfo) -> bool:
    """The local wall clock jumped forward at ``instant`` (a spring-forward end)."""
    before = (instant - timedelta(microseconds=1)).astimezone(zone).replace(tzinfo=None)
    now = instant.astimezone(zone).replace(tzinfo=None)
    return now - before > timedelta(microseconds=1)


def _cronsim_matches(expr: str, wall: datetime) -> bool:
    """cronsim (an evaluator we did not write) says ``wall`` is one of ``expr``'s slots."""
    return bool(next(CronSim(expr, wall - timedelta(minutes=1))) == wall)


def _exists(naive: datetime, zone: ZoneInfo) -> bool:
    return naive.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None) == naive


@settings(max_examples=150, deadline=None)
@given(
    zone_name=st.sampled_from(ZONES),
    expr=cron_expressions(),
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2040, 12, 31)),
    hours=st.integers(min_value=1, max_value=60),
    near_transition=st.booleans(),
)
def test_cron_properties(
    zone_name: str, expr: str, start: datetime, hours: int, near_transition: bool
) -> None:
    zone = ZoneInfo(zone_name)
    after = start.replace(tzinfo=UTC)
    if near_transition:
        # Half of the examples straddle an offset change, where the bugs live.
        change = _next_transition(zone, after)
        if change is not None:
            after = change - timedelta(hours=3, minutes=start.minute)
    until = after + timedelta(hours=hours)
    got = take(CronSchedule(expr, zone_name).fire_times(after, until))

    assert all(t.tzinfo is UTC for t in got)
    assert all(after < t <= until for t in got)
    assert all(a < b for a, b in itertools.pairwise(got))
    local = [t.astimezone(zone).replace(tzinfo=None) for t in got]
    schedule = CronSchedule(expr, zone_name)
    if not schedule.fixed_time:
        # cron(8): every real instant whose wall time matches, and nothing else.
        assert got == walked_fires(expr, zone_name, after, until)
        return
    assert len(set(local)) == len(local), "a fixed time fires once per wall-clock slot"
    for t, wall in zip(got, local, strict=True):
        assert _cronsim_matches(expr, wall) or _is_gap_end(t, zone), (t, wall)

    # Completeness: every existing wall-clock slot whose first occurrence lies
    # in the window fired.
    fired = set(got)
    it = CronSim(expr, after.astimezone(zone).replace(tzinfo=None) - timedelta(hours=4))
    last_local = until.astimezone(zone).replace(tzinfo=None) + timedelta(hours=4)
    while (slot := next(it)) <= last_local:
        if _exists(slot, zone):
            instant = slot.replace(tzinfo=zone, fold=0).astimezone(UTC)
            if after < instant <= until:
                assert instant in fired, (slot, instant)


@pytest.mark.parametrize(
    ("zone", "naive", "expected_utc"),
    [
        (BERLIN, datetime(2026, 3, 29, 2, 30), datetime(2026, 3, 29, 1, 0)),  # gap -> its end
        (BERLIN, datetime(2026, 10, 25, 2, 30), datetime(2026, 10, 25, 0, 30)),  # first pass
        (BERLIN, datetime(2026, 7, 1, 2, 30), datetime(2026, 7, 1, 0, 30)),  # ordinary
        # Lord Howe Island moves its clock by 30 minutes: 02:00 -> 02:30.
        ("Australia/Lord_Howe", datetime(2026, 10, 4, 2, 10), datetime(2026, 10, 3, 15, 30)),
    ],
)
def test_local_to_instant_follows_the_dst_rule(
    zone: str, naive: datetime, expected_utc: datetime
) -> None:
    assert local_to_instant(naive, ZoneInfo(zone)) == expected_utc.replace(tzinfo=UTC)

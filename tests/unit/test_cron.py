"""Cron rules, case by case: what claimd accepts, what each expression fires, what it refuses.

The reference is crontab(5); the differential test (test_cron_differential.py)
checks the same rules against cronsim over thousands of random expressions.
Expected dates here are written out by hand (checked against a calendar), not
computed by the code under test.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from actors.domain import CronSchedule, InvalidSchedule, parse_cron, take

BERLIN = "Europe/Berlin"


def local_fires(expr: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """Fire times of ``expr`` after local ``start`` up to local ``end``, as naive local walls."""
    z = ZoneInfo(zone)
    schedule = CronSchedule(expr, zone)
    got = take(
        schedule.fire_times(
            start.replace(tzinfo=z).astimezone(UTC), end.replace(tzinfo=z).astimezone(UTC)
        )
    )
    return [t.astimezone(z).replace(tzinfo=None) for t in got]


def days_fired(expr: str, year: int, month: int) -> list[int]:
    """Days of one month (UTC) on which a daily-at-midnight expression fires."""
    start = datetime(year, month, 1) - timedelta(minutes=1)
    end = datetime(year, month + 1, 1) - timedelta(minutes=1)
    return [t.day for t in local_fires(expr, "UTC", start, end)]


# -- single-value ranges: croniter 5+ reads N-N as '*', we read one value -------------------


@pytest.mark.parametrize("zone", ["UTC", BERLIN, "America/New_York"])
def test_a_single_value_hour_range_fires_once_a_day(zone: str) -> None:
    got = local_fires("0 9-9 * * *", zone, datetime(2026, 6, 1), datetime(2026, 6, 4))
    assert got == [datetime(2026, 6, d, 9, 0) for d in (1, 2, 3)]


@pytest.mark.parametrize(
    ("expr", "start", "end", "expected"),
    [
        # once a year, on December 1st, not on the 1st of every month
        (
            "0 0 1 12-12 *",
            datetime(2026, 1, 1),
            datetime(2028, 1, 1),
            [datetime(2026, 12, 1), datetime(2027, 12, 1)],
        ),
        # at minute 5 of every hour, not every minute
        (
            "5-5 * * * *",
            datetime(2026, 6, 1),
            datetime(2026, 6, 1, 3),
            [datetime(2026, 6, 1, h, 5) for h in (0, 1, 2)],
        ),
        # a step on a one-value range is that value: 03:00 daily, not every two hours
        (
            "0 3-3/2 * * *",
            datetime(2026, 6, 1),
            datetime(2026, 6, 3, 23),
            [datetime(2026, 6, d, 3) for d in (1, 2, 3)],
        ),
        # the same in the day-of-week field: Wednesdays only
        (
            "0 12 * * 3-3",
            datetime(2026, 6, 1),
            datetime(2026, 6, 30),
            [datetime(2026, 6, d, 12) for d in (3, 10, 17, 24)],
        ),
    ],
)
def test_single_value_ranges_from_the_issue(
    expr: str, start: datetime, end: datetime, expected: list[datetime]
) -> None:
    assert local_fires(expr, "UTC", start, end) == expected


def test_a_single_value_range_in_a_dst_gap_fires_once_at_the_end_of_the_gap() -> None:
    # 2026-03-29 02:30 does not exist in Berlin: the DST rule, not the range, decides.
    got = local_fires("30 2-2 * * *", BERLIN, datetime(2026, 3, 28), datetime(2026, 3, 30, 12))
    assert got == [
        datetime(2026, 3, 28, 2, 30),
        datetime(2026, 3, 29, 3, 0),
        datetime(2026, 3, 30, 2, 30),
    ]


# -- the day rule (crontab(5)) --------------------------------------------------------------


# January 2026: the 1st is a Thursday; Mondays 5 12 19 26; Sundays 4 11 18 25.
@pytest.mark.parametrize(
    ("expr", "days"),
    [
        # both restricted: either may match (OR)
        ("0 0 1 * MON", [1, 5, 12, 19, 26]),
        ("0 0 1-3 * 0", [1, 2, 3, 4, 11, 18, 25]),
        ("0 0 1,15 * 1", [1, 5, 12, 15, 19, 26]),
        # day-of-month starts with '*': not a restriction, so both must match (AND)
        ("0 0 */2 * 0", [11, 25]),
        ("0 0 */2 * *", list(range(1, 32, 2))),
        # day-of-week starts with '*' (*/7 is Sunday): AND, so the 1st only if it is a Sunday
        ("0 0 1 * */7", []),
        ("0 0 * * */7", [4, 11, 18, 25]),
        # only one field restricted: that field alone decides
        ("0 0 1,15 * *", [1, 15]),
        (
            "0 0 * * 1-5",
            [1, 2, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 19, 20, 21, 22, 23, 26, 27, 28, 29, 30],
        ),
    ],
)
def test_day_of_month_and_day_of_week(expr: str, days: list[int]) -> None:
    assert days_fired(expr, 2026, 1) == days


def test_and_rule_on_the_first_of_a_month_that_is_a_sunday() -> None:
    # 1st-of-month Sundays: 2026-02-01, 2026-03-01, 2026-11-01, 2027-08-01.
    got = local_fires("0 0 1 * */7", "UTC", datetime(2026, 1, 1), datetime(2027, 12, 31))
    assert got == [
        datetime(2026, 2, 1),
        datetime(2026, 3, 1),
        datetime(2026, 11, 1),
        datetime(2027, 8, 1),
    ]


def test_a_rare_expression_is_found_decades_ahead_without_walking_every_minute() -> None:
    # February 29th on a Sunday (AND: day-of-week starts with '*'): 2032, 2060, 2088.
    got = local_fires("0 0 29 2 */7", "UTC", datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert got == [
        datetime(2004, 2, 29),
        datetime(2032, 2, 29),
        datetime(2060, 2, 29),
        datetime(2088, 2, 29),
    ]


# -- syntax: steps, lists, names, Sunday twice, nicknames -----------------------------------


@pytest.mark.parametrize(
    ("expr", "minutes", "hours", "days", "months", "weekdays"),
    [
        ("*/15 * * * *", [0, 15, 30, 45], list(range(24)), range(1, 32), range(1, 13), range(7)),
        (
            "10-50/20 */6 */10 */5 *",
            [10, 30, 50],
            [0, 6, 12, 18],
            [1, 11, 21, 31],
            [1, 6, 11],
            range(7),
        ),
        ("*/60 */24 */31 */12 */7", [0], [0], [1], [1], [0]),
        ("0,30 8-10,20 1,5-5 * *", [0, 30], [8, 9, 10, 20], [1, 5], range(1, 13), range(7)),
        # names in any case, in lists and ranges; 0 and 7 are both Sunday
        ("0 0 * jan,Jul,DEC mon-FRI", [0], [0], range(1, 32), [1, 7, 12], [1, 2, 3, 4, 5]),
        ("0 0 * * 7", [0], [0], range(1, 32), range(1, 13), [0]),
        ("0 0 * * SUN,0,7", [0], [0], range(1, 32), range(1, 13), [0]),
        ("0 0 * * 5-7", [0], [0], range(1, 32), range(1, 13), [0, 5, 6]),
        ("0 0 * * 0-7", [0], [0], range(1, 32), range(1, 13), range(7)),
        ("0 0 * feb-apr/2 *", [0], [0], range(1, 32), [2, 4], range(7)),
        ("  0\t9  *  *  *  ", [0], [9], range(1, 32), range(1, 13), range(7)),
    ],
)
def test_fields_read_as_crontab5_says(
    expr: str,
    minutes: list[int],
    hours: list[int],
    days: range | list[int],
    months: range | list[int],
    weekdays: range | list[int],
) -> None:
    cron = parse_cron(expr)
    assert list(cron.minutes) == minutes
    assert list(cron.hours) == hours
    assert sorted(cron.days) == list(days)
    assert list(cron.months) == list(months)
    assert sorted(cron.weekdays) == list(weekdays)


@pytest.mark.parametrize(
    ("nickname", "same_as"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_nicknames_fire_as_their_five_field_form(nickname: str, same_as: str) -> None:
    start, end = datetime(2026, 1, 1), datetime(2028, 1, 1)
    assert local_fires(nickname, BERLIN, start, end) == local_fires(same_as, BERLIN, start, end)
    assert CronSchedule(nickname).expression == nickname  # stored as written


def test_weekly_is_sunday_midnight() -> None:
    got = local_fires("@weekly", "UTC", datetime(2026, 1, 1), datetime(2026, 1, 31))
    assert got == [datetime(2026, 1, d) for d in (4, 11, 18, 25)]


def test_matches_follows_the_same_rules() -> None:
    cron = parse_cron("0 9-9 1 * MON")
    assert cron.matches(datetime(2026, 1, 1, 9, 0))  # the 1st (a Thursday)
    assert cron.matches(datetime(2026, 1, 5, 9, 0))  # a Monday
    assert not cron.matches(datetime(2026, 1, 2, 9, 0))  # neither
    assert not cron.matches(datetime(2026, 1, 5, 10, 0))  # hour 10 is not 9-9


@pytest.mark.parametrize(
    ("expr", "explained"),
    [
        ("0 9-9 * * *", "minute 0; hour 9; day-of-month *; month *; day-of-week *"),
        (
            "*/20 0-3,12 * 12-12 *",
            "minute 0,20,40; hour 0-3,12; day-of-month *; month 12; day-of-week *",
        ),
        (
            "0 0 1,15 * MON",
            "minute 0; hour 0; day-of-month 1,15; month *; day-of-week 1; "
            "a day matches if day-of-month OR day-of-week does",
        ),
        (
            "0 0 */2 * 0",
            "minute 0; hour 0; day-of-month 1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31"
            "; month *; day-of-week 0; a day must match day-of-month AND day-of-week",
        ),
        # OR with one side covering every day: every day
        ("0 0 1-31 * MON", "minute 0; hour 0; day-of-month *; month *; day-of-week *"),
        ("0 0 * * 7", "minute 0; hour 0; day-of-month *; month *; day-of-week 0"),
        ("@weekly", "minute 0; hour 0; day-of-month *; month *; day-of-week 0"),
    ],
)
def test_explain_states_what_fires(expr: str, explained: str) -> None:
    assert parse_cron(expr).explain() == explained


# -- refusals: exact messages ----------------------------------------------------------------


def _invalid(expr: str, problem: str) -> tuple[str, str]:
    return expr, f"invalid cron expression {expr!r}: {problem}"


REFUSALS = [
    _invalid("0 0 L * *", "day-of-month 'L': 'L' (last day) is not supported"),
    _invalid("0 0 * * 5L", "day-of-week '5L': 'L' (last day) is not supported"),
    _invalid("0 0 15W * *", "day-of-month '15W': 'W' (nearest weekday) is not supported"),
    _invalid("0 0 LW * *", "day-of-month 'LW': 'LW' (last weekday of the month) is not supported"),
    _invalid(
        "0 0 * * MON#2", "day-of-week 'MON#2': '#' (nth weekday of the month) is not supported"
    ),
    _invalid("0 0 ? * MON", "day-of-month '?': '?' is not supported (write '*')"),
    _invalid("0 0 1 * ?", "day-of-week '?': '?' is not supported (write '*')"),
    _invalid(
        "0 0 9 * * *",
        "it has 6 fields; claimd reads five: minute hour day-of-month month "
        "day-of-week (a seconds or year field is not supported)",
    ),
    _invalid(
        "0 0 9 * * * 2026",
        "it has 7 fields; claimd reads five: minute hour day-of-month "
        "month day-of-week (a seconds or year field is not supported)",
    ),
    _invalid(
        "0 2 * *", "it has 4 fields; claimd reads five: minute hour day-of-month month day-of-week"
    ),
    _invalid("", "it has 0 fields; claimd reads five: minute hour day-of-month month day-of-week"),
    _invalid("@reboot", "@reboot is not supported (claimd fires on the clock, not at start-up)"),
    _invalid(
        "@fortnightly",
        "unknown nickname; claimd knows @yearly, @annually, @monthly, "
        "@weekly, @daily, @midnight, @hourly",
    ),
    _invalid("61 * * * *", "minute '61': 61 is out of range (0-59)"),
    _invalid("0 24 * * *", "hour '24': 24 is out of range (0-23)"),
    _invalid("0 0 0 * *", "day-of-month '0': 0 is out of range (1-31)"),
    _invalid("0 0 32 * *", "day-of-month '32': 32 is out of range (1-31)"),
    _invalid("0 0 * 13 *", "month '13': 13 is out of range (1-12)"),
    _invalid("0 0 * * 8", "day-of-week '8': 8 is out of range (0-7)"),
    _invalid("5-3 * * * *", "minute '5-3': the range 5-3 is reversed (its start is after its end)"),
    _invalid(
        "0 0 * * FRI-MON",
        "day-of-week 'FRI-MON': the range FRI-MON is reversed (its start is after its end)",
    ),
    _invalid("*/0 * * * *", "minute '*/0': a step of 0 is not allowed"),
    _invalid("0 1-5/0 * * *", "hour '1-5/0': a step of 0 is not allowed"),
    _invalid("*/61 * * * *", "minute '*/61': the step 61 is larger than the field (60 values)"),
    _invalid("0 0 * * */8", "day-of-week '*/8': the step 8 is larger than the field (7 values)"),
    _invalid("5/15 * * * *", "minute '5/15': a step needs a range or '*' (write 5-59/15 or */15)"),
    _invalid("1,,2 * * * *", "minute '1,,2': an empty list item"),
    _invalid("0 0 * FOO *", "month 'FOO': 'FOO' is neither a number nor a month name (JAN-DEC)"),
    _invalid(
        "0 0 * * monday",
        "day-of-week 'monday': 'monday' is neither a number nor a weekday name (SUN-SAT)",
    ),
    _invalid("0 MON * * *", "hour 'MON': 'MON' is not a number"),
    _invalid("-5 * * * *", "minute '-5': a number is missing"),
    _invalid("*/x * * * *", "minute '*/x': the step 'x' is not a number"),
    (
        "0 0 30 2 *",
        "cron expression '0 0 30 2 *' never fires (none of its months has any of "
        "its days of the month)",
    ),
    (
        "0 0 31 4,6,9,11 *",
        "cron expression '0 0 31 4,6,9,11 *' never fires (none of its months "
        "has any of its days of the month)",
    ),
]


@pytest.mark.parametrize(("expr", "message"), REFUSALS)
def test_refusals_name_the_field_and_the_problem(expr: str, message: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule(expr)
    assert str(caught.value) == message


@pytest.mark.parametrize("expr", ["0 0 30 2 MON", "0 0 31 4 1-5", "0 0 29 2 *"])
def test_possible_but_rare_days_are_accepted(expr: str) -> None:
    # OR rule (both restricted): February Mondays fire; February 29th exists in leap years.
    assert take(
        CronSchedule(expr).fire_times(
            datetime(2026, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC)
        ),
        1,
    )

"""cron(8)'s DST rule around every UTC-offset change of every zone, 2027-2030 (issue 22).

The reference is cronsim, an evaluator we did not write, and a brute-force
walk of real time (``tests/unit/dst_reference.py`` says where cronsim departs
from its own rule and why). Two random expressions per change, from a fixed
seed: a wildcard minute or hour must fire at cronsim's instants, a fixed time
as many times per local day. ``bench/dst_sweep.py`` runs more and prints the
before/after figures.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from actors.domain import (
    CronSchedule,
    DstFold,
    DstGap,
    DstPolicy,
    Job,
    ShellSpec,
    next_plan,
    plan_materialization,
    take,
)
from tests.unit.dst_reference import (
    EVERY_ZONE,
    compare_window,
    cronsim_fires,
    random_expression,
    transitions_between,
)

SEED = 22
PER_CHANGE = 2
WINDOWS = [
    (name, at)
    for name in EVERY_ZONE
    for at in transitions_between(
        name, datetime(2027, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    )
]
BERLIN = ZoneInfo("Europe/Berlin")


def test_every_change_of_every_zone_fires_as_cron8_does() -> None:
    assert len(WINDOWS) > 1000  # every zone's changes were found (1,610 in tzdata 2025)
    rng = random.Random(SEED)
    problems = [
        problem
        for name, at in WINDOWS
        for _ in range(PER_CHANGE)
        if (problem := compare_window(random_expression(rng), name, at)) is not None
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("expr", "zone"),
    [
        ("* * * * *", "Europe/Berlin"),
        ("*/15 * * * *", "America/New_York"),
        ("30 * * * *", "Europe/Berlin"),
        ("0 */2 * * *", "Australia/Sydney"),
    ],
)
def test_the_issues_wildcards_equal_cronsim_through_2030(expr: str, zone: str) -> None:
    """Every change of four years at once, both directions: the instants are cronsim's."""
    after, until = datetime(2027, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)
    for at in transitions_between(zone, after, until):
        window = (at - timedelta(hours=5), at + timedelta(hours=5))
        ours = list(CronSchedule(expr, zone).fire_times(*window))
        assert ours == cronsim_fires(expr, zone, *window), (expr, zone, at)


def test_every_minute_fires_480_times_in_the_8_hours_around_the_fall_change() -> None:
    """The issue's count: 420 before (the repeated hour lost), 480 real minutes."""
    change = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)
    after = change - timedelta(hours=4, microseconds=1)
    fired = list(
        CronSchedule("* * * * *", "Europe/Berlin").fire_times(
            after, change + timedelta(hours=4) - timedelta(minutes=1)
        )
    )
    assert len(fired) == 480


def berlin_day() -> tuple[datetime, datetime]:
    """Local day 2026-10-25 in Berlin, 25 hours long: [its first instant, the next day's)."""
    start = datetime(2026, 10, 25, tzinfo=BERLIN).astimezone(UTC)
    return start, datetime(2026, 10, 26, tzinfo=BERLIN).astimezone(UTC)


def test_the_planner_plans_1500_minutes_on_berlins_25_hour_day() -> None:
    start, end = berlin_day()
    assert end - start == timedelta(hours=25)
    job = Job("every-minute", CronSchedule("* * * * *", "Europe/Berlin"), ShellSpec(("/bin/true",)))
    mark = start - timedelta(microseconds=1)
    plan = plan_materialization(job, mark, mark, timedelta(hours=25))
    day = [run.scheduled_at for run in plan.runs if run.scheduled_at < end]
    assert len(day) == 1500
    assert len(set(day)) == 1500
    # The mark the materializer keeps (just before the next instant) walks the
    # repeated hour too: 1,500 steps, one instant each, none skipped.
    stepped: list[datetime] = []
    while True:
        ahead = next_plan(job, mark)
        assert ahead.instant is not None
        if ahead.instant >= end:
            break
        stepped.append(ahead.instant)
        mark = ahead.instant
    assert stepped == day


@pytest.mark.parametrize(
    ("policy", "spring", "fall"),
    [
        # cron(8)'s default: the end of the gap; the first occurrence.
        (DstPolicy(), ["03:00+0200"], ["02:30+0200"]),
        (DstPolicy(DstGap.SKIP, DstFold.LAST), [], ["02:30+0100"]),
        (DstPolicy(DstGap.SHIFT, DstFold.BOTH), ["03:00+0200"], ["02:30+0200", "02:30+0100"]),
    ],
)
def test_a_fixed_time_follows_its_dst_policy(
    policy: DstPolicy, spring: list[str], fall: list[str]
) -> None:
    schedule = CronSchedule("30 2 * * *", "Europe/Berlin", policy)

    def on(day: datetime) -> list[str]:
        after = day.astimezone(UTC) - timedelta(microseconds=1)
        fired = take(schedule.fire_times(after, after + timedelta(hours=24)))
        return [t.astimezone(BERLIN).strftime("%H:%M%z") for t in fired]

    assert on(datetime(2026, 3, 29, tzinfo=BERLIN)) == spring
    assert on(datetime(2026, 10, 25, tzinfo=BERLIN)) == fall
    assert on(datetime(2026, 10, 26, tzinfo=BERLIN)) == ["02:30+0100"]  # an ordinary day
    # check-config's account: what the rule skipped there, and why.
    notes = schedule.dst_notes(
        datetime(2026, 3, 28, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC)
    )
    gap, fold = (n for n in notes if n.kind == "gap"), (n for n in notes if n.kind == "fold")
    assert bool(next(gap).fired) == (policy.gap is DstGap.SHIFT)
    assert len(next(fold).missed) == (0 if policy.fold is DstFold.BOTH else 1)

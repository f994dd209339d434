"""A backfill's range is counted before anything is written: by arithmetic for intervals."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from actors.domain import CronSchedule, IntervalSchedule
from actors.domain.backfill import count_instants as _count_instants


def test_an_interval_is_counted_exactly_by_arithmetic_as_walking_it_would() -> None:
    rng = random.Random(7)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    for _ in range(200):
        every = timedelta(milliseconds=rng.choice([1, 7, 250, 1000, 90_000, 3_600_000]))
        anchor = base + timedelta(microseconds=rng.randrange(-(10**9), 10**9))
        schedule = IntervalSchedule(every, anchor)
        after = base + timedelta(microseconds=rng.randrange(-(10**9), 10**9))
        # From an empty range (until before after) to a few thousand instants.
        until = after + every * rng.uniform(-2, 3000)
        walked = sum(1 for _ in schedule.fire_times(after, until))
        assert _count_instants(schedule, after, until, 10) == (walked, True), (
            every,
            anchor,
            after,
            until,
        )


def test_a_cron_schedule_is_walked_and_a_count_past_the_ceiling_is_a_lower_bound() -> None:
    schedule = CronSchedule("*/15 * * * *", "UTC")
    after = datetime(2024, 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
    day = after + timedelta(days=1)
    assert _count_instants(schedule, after, day, 1000) == (96, True)
    assert _count_instants(schedule, after, day, 96) == (96, True)
    assert _count_instants(schedule, after, day, 50) == (51, False)

"""The status page's schedule in words, and the range that holds a job's last instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.domain import take
from actors.domain.schedule import CronSchedule, IntervalSchedule
from actors.operator.grid import last_instants_start
from actors.operator.words import cron_words, interval_words


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("15 * * * *", "every hour at :15"),
        ("0 */6 * * *", "every 6 hours at :00"),
        ("0 2 * * *", "every day at 02:00"),
        ("@daily", "every day at 00:00"),
        ("30 7 * * 1-5", "every Monday to Friday at 07:30"),
        ("0 9 * * mon,thu", "every Monday, Thursday at 09:00"),
        ("0 3 1 * *", "on day 1 of every month at 03:00"),
        ("0 3 * 2 *", "cron '0 3 * 2 *'"),
        ("5-10 3 * * *", "cron '5-10 3 * * *'"),
    ],
)
def test_cron_in_words(expression: str, words: str) -> None:
    assert cron_words(expression) == words


@pytest.mark.parametrize(
    ("every", "words"),
    [
        (timedelta(seconds=1), "every second"),
        (timedelta(seconds=30), "every 30 seconds"),
        (timedelta(minutes=15), "every 15 minutes"),
        (timedelta(hours=2), "every 2 hours"),
        (timedelta(days=1), "every day"),
        (timedelta(milliseconds=1500), "every 1500 ms"),
    ],
)
def test_interval_in_words(every: timedelta, words: str) -> None:
    assert interval_words(every) == words


NOW = datetime(2026, 12, 1, 10, 30, 15, tzinfo=UTC)


@pytest.mark.parametrize(
    "schedule",
    [
        CronSchedule("0 2 * * *", "Europe/Berlin"),
        CronSchedule("*/5 * * * *"),
        CronSchedule("0 9 * * 1-5", "America/New_York"),
        IntervalSchedule(timedelta(seconds=7)),
    ],
)
def test_the_range_holds_exactly_the_last_instants(
    schedule: CronSchedule | IntervalSchedule,
) -> None:
    start = last_instants_start(schedule, NOW, None, 30)
    instants = take(schedule.fire_times(start - timedelta(microseconds=1), NOW), 100)
    assert len(instants) == 30
    assert instants[0] == start


def test_the_range_starts_no_earlier_than_the_job_was_due() -> None:
    since = NOW - timedelta(minutes=12)
    start = last_instants_start(CronSchedule("*/5 * * * *"), NOW, since, 30)
    assert start == since


def test_a_yearly_job_looks_back_four_years_at_most() -> None:
    start = last_instants_start(CronSchedule("0 0 1 1 *"), NOW, None, 30)
    assert NOW - start <= timedelta(days=4 * 366)

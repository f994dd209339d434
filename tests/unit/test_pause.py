"""Resume's skip, pure: which instants it accounts for, with which reason, and the audit's word."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.domain.history import Status, audit_range
from actors.domain.pause import instants_between, paused_gaps
from actors.domain.schedule import CronSchedule, IntervalSchedule

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("every", "after", "until"),
    [
        (timedelta(seconds=1), T0, T0 + timedelta(seconds=10)),
        (timedelta(seconds=7), T0 + timedelta(milliseconds=300), T0 + timedelta(minutes=3)),
        (timedelta(milliseconds=250), T0 - timedelta(microseconds=1), T0 + timedelta(seconds=2)),
        (timedelta(hours=5), T0, T0 + timedelta(hours=1)),  # none
    ],
)
def test_an_interval_span_is_counted_as_walking_it_would(
    every: timedelta, after: datetime, until: datetime
) -> None:
    schedule = IntervalSchedule(every, anchor=T0 - timedelta(milliseconds=130))
    walked = list(schedule.fire_times(after, until))
    span = instants_between(schedule, after, until)
    if not walked:
        assert span is None
        return
    assert span is not None
    assert (span.first, span.last, span.count) == (walked[0], walked[-1], len(walked))


def test_a_cron_span_is_walked() -> None:
    schedule = CronSchedule("*/15 * * * *", "Europe/Berlin")
    span = instants_between(schedule, T0, T0 + timedelta(hours=1))
    assert span is not None
    assert (span.first, span.last, span.count) == (
        T0 + timedelta(minutes=15),
        T0 + timedelta(hours=1),
        4,
    )


def test_skipped_instants_are_paused_in_the_audit_and_those_before_the_pause_are_not() -> None:
    schedule = IntervalSchedule(timedelta(seconds=1))
    mark = T0 + timedelta(seconds=2)  # no replica planned past here
    paused_at = T0 + timedelta(seconds=4, milliseconds=500)
    now = T0 + timedelta(seconds=9, milliseconds=500)
    gaps = paused_gaps(schedule, mark, paused_at, now, "alice")
    assert [(g.first, g.last, g.count) for g in gaps] == [
        (T0 + timedelta(seconds=3), T0 + timedelta(seconds=4), 2),
        (T0 + timedelta(seconds=5), T0 + timedelta(seconds=9), 5),
    ]
    assert gaps[0].reason.startswith("due before the pause and not planned by then")
    assert gaps[1].reason.startswith(f"paused {paused_at.isoformat()}; resumed ")
    assert "by alice with the paused instants skipped" in gaps[1].reason

    audit = audit_range(
        schedule, T0 + timedelta(seconds=3), T0 + timedelta(seconds=9), now, None, [], gaps
    )
    assert [e.status for e in audit.entries] == [Status.DROPPED] * 2 + [Status.PAUSED] * 5
    assert audit.complete  # nothing missing


def test_without_a_recorded_pause_every_unwritten_instant_is_skipped_as_paused() -> None:
    schedule = IntervalSchedule(timedelta(seconds=1))
    gaps = paused_gaps(schedule, T0, None, T0 + timedelta(seconds=3), "bob")
    assert [(g.count, g.reason.split(";")[0]) for g in gaps] == [(3, "paused (pause not recorded)")]

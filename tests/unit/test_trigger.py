"""Which instants a trigger accepts, and whether the schedule names them (pure, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.domain import CronSchedule, IntervalSchedule, Overlap
from actors.domain.trigger import EARLIEST_TRIGGER, TriggerRefused, judge_trigger, run_overlap

NOW = datetime(2026, 12, 1, 21, 30, tzinfo=UTC)
NIGHTLY = CronSchedule("0 2 * * *", "Europe/Berlin")


def test_an_instant_after_now_is_refused_with_the_reason() -> None:
    tomorrow = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)  # 02:00 in Berlin
    with pytest.raises(TriggerRefused, match=r"later than now .*would never happen"):
        judge_trigger("nightly", NIGHTLY, tomorrow, NOW)
    with pytest.raises(TriggerRefused, match="later than now"):
        judge_trigger("nightly", NIGHTLY, NOW + timedelta(microseconds=1), NOW)


def test_now_itself_and_the_earliest_bound_are_accepted_and_before_it_is_not() -> None:
    assert judge_trigger("nightly", NIGHTLY, NOW, NOW) is False
    judge_trigger("nightly", NIGHTLY, EARLIEST_TRIGGER, NOW)
    with pytest.raises(TriggerRefused, match="before 2000-01-01"):
        judge_trigger("nightly", NIGHTLY, EARLIEST_TRIGGER - timedelta(microseconds=1), NOW)


@pytest.mark.parametrize(
    ("instant", "named"),
    [
        (datetime(2026, 12, 1, 1, 0, tzinfo=UTC), True),  # 02:00 CET
        (datetime(2026, 7, 1, 0, 0, tzinfo=UTC), True),  # 02:00 CEST
        (datetime(2026, 7, 1, 1, 0, tzinfo=UTC), False),  # 03:00 CEST
        (datetime(2026, 12, 1, 1, 0, 0, 1, tzinfo=UTC), False),  # a microsecond late
        # 29 March 2026: 02:00 does not exist in Berlin; the schedule fires at 03:00 CEST.
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), True),
    ],
)
def test_a_cron_schedule_names_its_own_instants_across_dst(instant: datetime, named: bool) -> None:
    assert judge_trigger("nightly", NIGHTLY, instant, NOW) is named


def test_an_interval_schedule_names_its_multiples_of_the_period() -> None:
    every = IntervalSchedule(timedelta(seconds=30))
    assert judge_trigger("beat", every, datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC), NOW)
    assert not judge_trigger("beat", every, datetime(2026, 1, 1, 0, 0, 31, tzinfo=UTC), NOW)


def test_an_operators_runs_of_an_exclusive_job_queue_by_default() -> None:
    assert run_overlap("f", Overlap.FORBID, None) is Overlap.QUEUE
    assert run_overlap("q", Overlap.QUEUE, None) is Overlap.QUEUE
    assert run_overlap("a", Overlap.ALLOW, None) is Overlap.ALLOW
    assert run_overlap("f", Overlap.FORBID, "forbid") is Overlap.FORBID
    assert run_overlap("f", Overlap.FORBID, "allow") is Overlap.ALLOW
    assert run_overlap("q", Overlap.QUEUE, "allow") is Overlap.ALLOW


@pytest.mark.parametrize(
    ("job_overlap", "asked", "words"),
    [
        (Overlap.ALLOW, "queue", "overlap queue does not apply to j, whose overlap is allow"),
        (Overlap.ALLOW, "forbid", "choose allow"),
        (Overlap.QUEUE, "forbid", "choose queue, allow"),
        (Overlap.FORBID, "sometimes", "overlap must be one of queue, forbid, allow for j"),
    ],
)
def test_a_mode_the_job_does_not_offer_is_refused_saying_which_it_does(
    job_overlap: Overlap, asked: str, words: str
) -> None:
    with pytest.raises(TriggerRefused, match=words):
        run_overlap("j", job_overlap, asked)

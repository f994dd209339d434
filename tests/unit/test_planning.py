"""Which instants the materializer writes: first sight, ticks, catch-up after downtime, jitter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from actors.domain import (
    Catchup,
    CronSchedule,
    IntervalSchedule,
    Job,
    PlannedRun,
    PythonSpec,
    plan_materialization,
)
from actors.domain.schedule import MAX_INSTANTS_PER_PLAN

NOW = datetime(2026, 3, 10, 12, 0, 0, tzinfo=UTC)
HORIZON = timedelta(minutes=2)
MINUTE = timedelta(minutes=1)


def make_job(every: timedelta = MINUTE, name: str = "report", **kwargs: Any) -> Job:
    return Job(
        name=name,
        schedule=IntervalSchedule(every),
        executor=PythonSpec("tests.unit.jobfuncs:sync_job"),
        **kwargs,
    )


def scheduled(runs: list[PlannedRun]) -> list[datetime]:
    return [r.scheduled_at for r in runs]


def test_first_sight_starts_at_now_and_invents_no_history() -> None:
    plan = plan_materialization(make_job(), None, NOW, HORIZON)
    # NOW itself is on the minute grid; "after now" excludes it.
    assert scheduled(plan.runs) == [NOW + MINUTE, NOW + 2 * MINUTE]
    assert plan.materialized_until == NOW + HORIZON
    assert plan.missed == 0


def test_first_sight_off_grid() -> None:
    now = NOW + timedelta(seconds=30)
    plan = plan_materialization(make_job(), None, now, HORIZON)
    assert scheduled(plan.runs) == [NOW + MINUTE, NOW + 2 * MINUTE]
    assert plan.materialized_until == now + HORIZON


def test_normal_tick_continues_from_the_high_water_mark() -> None:
    job = make_job()
    first = plan_materialization(job, None, NOW, HORIZON)
    # One second later: only what is new under the moved horizon.
    later = NOW + timedelta(seconds=61)
    second = plan_materialization(job, first.materialized_until, later, HORIZON)
    assert scheduled(second.runs) == [NOW + 3 * MINUTE]
    assert second.materialized_until == later + HORIZON
    assert second.missed == 0
    # Nothing is planned twice across ticks.
    assert not set(scheduled(first.runs)) & set(scheduled(second.runs))


def test_tick_with_nothing_new() -> None:
    job = make_job()
    first = plan_materialization(job, None, NOW, HORIZON)
    again = plan_materialization(job, first.materialized_until, NOW, HORIZON)
    assert again.runs == []
    assert again.materialized_until == first.materialized_until
    assert again.missed == 0


def test_high_water_mark_ahead_of_the_horizon_is_kept() -> None:
    # Another replica with a longer horizon wrote further ahead: never go backwards.
    ahead = NOW + timedelta(hours=1)
    plan = plan_materialization(make_job(), ahead, NOW, HORIZON)
    assert plan.runs == []
    assert plan.materialized_until == ahead


# -- catch-up after downtime ---------------------------------------------------------------

DOWN_SINCE = NOW - timedelta(hours=3)  # the last tick before the outage
WINDOW = timedelta(minutes=30)


@pytest.mark.parametrize(
    ("catchup", "kept_past", "missed"),
    [
        # 179 instants passed while down; the window holds those of the last 30 minutes.
        (Catchup.ALL, [NOW - timedelta(minutes=m) for m in range(30, 0, -1)], 149),
        (Catchup.LATEST, [NOW - MINUTE], 178),
        (Catchup.NONE, [], 179),
    ],
)
def test_catchup_after_downtime(catchup: Catchup, kept_past: list[datetime], missed: int) -> None:
    job = make_job(catchup=catchup, catchup_window=WINDOW)
    plan = plan_materialization(job, DOWN_SINCE, NOW, HORIZON)
    times = scheduled(plan.runs)
    future = [NOW, NOW + MINUTE, NOW + 2 * MINUTE]  # the instant at `now` is not missed
    assert times == [*kept_past, *future]
    assert plan.missed == missed
    assert plan.materialized_until == NOW + HORIZON
    # Every past instant is accounted for: kept or counted as missed.
    assert len(kept_past) + plan.missed == 179


def test_catchup_all_within_a_short_outage_keeps_everything() -> None:
    job = make_job(catchup=Catchup.ALL, catchup_window=timedelta(hours=1))
    plan = plan_materialization(job, NOW - timedelta(minutes=10), NOW, HORIZON)
    assert scheduled(plan.runs)[:10] == [NOW - timedelta(minutes=m) for m in range(9, -1, -1)]
    assert plan.missed == 0


def test_catchup_window_edge_is_inclusive() -> None:
    job = make_job(catchup=Catchup.ALL, catchup_window=timedelta(minutes=5))
    plan = plan_materialization(job, NOW - timedelta(minutes=7), NOW, HORIZON)
    past = [t for t in scheduled(plan.runs) if t < NOW]
    assert past[0] == NOW - timedelta(minutes=5)
    assert plan.missed == 1  # NOW-6min; NOW-7min was materialized before the outage


def test_catchup_for_cron_in_a_zone() -> None:
    job = Job(
        name="nightly",
        schedule=CronSchedule("0 2 * * *", "Europe/Berlin"),
        executor=PythonSpec("tests.unit.jobfuncs:sync_job"),
        catchup=Catchup.LATEST,
        catchup_window=timedelta(days=3),
    )
    # Down for a week: 02:00 Berlin (01:00 UTC in winter) on each day.
    plan = plan_materialization(job, NOW - timedelta(days=7), NOW, timedelta(days=1))
    assert scheduled(plan.runs) == [
        datetime(2026, 3, 10, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 11, 1, 0, tzinfo=UTC),
    ]
    assert plan.missed == 6


def test_catchup_latest_over_a_capped_catchup_keeps_one_run() -> None:
    """A catch-up longer than one plan's cap is planned in chunks; 'latest' is still one run."""
    job = make_job(
        every=timedelta(seconds=1), catchup=Catchup.LATEST, catchup_window=timedelta(days=3)
    )
    mark: datetime | None = NOW - timedelta(days=2)  # 172,800 instants ago
    kept: list[datetime] = []
    missed = 0
    chunks = 0
    while mark is not None and mark < NOW + HORIZON:
        plan = plan_materialization(job, mark, NOW, HORIZON)
        kept += [t for t in scheduled(plan.runs) if t < NOW]
        missed += plan.missed
        mark = plan.materialized_until
        chunks += 1
    assert chunks > 1  # the cap was hit: the test covers the chunked path
    assert MAX_INSTANTS_PER_PLAN < 2 * 86_400
    assert kept == [NOW - timedelta(seconds=1)]
    assert missed == 2 * 86_400 - 1 - 1  # every past instant but the kept one


def test_capped_plan_continues_where_it_stopped() -> None:
    job = make_job(
        every=timedelta(seconds=1), catchup=Catchup.ALL, catchup_window=timedelta(days=3)
    )
    start = NOW - timedelta(days=2)
    plan = plan_materialization(job, start, NOW, HORIZON)
    assert len(plan.runs) == MAX_INSTANTS_PER_PLAN
    # The mark is the last instant planned, not the horizon: nothing is skipped.
    assert plan.materialized_until == plan.runs[-1].scheduled_at
    nxt = plan_materialization(job, plan.materialized_until, NOW, HORIZON)
    assert nxt.runs[0].scheduled_at == plan.materialized_until + timedelta(seconds=1)


# -- jitter --------------------------------------------------------------------------------


def test_jitter_is_deterministic_and_within_bounds() -> None:
    jitter = timedelta(seconds=30)
    job = make_job(jitter=jitter)
    horizon = timedelta(hours=2)
    a = plan_materialization(job, None, NOW, horizon)
    b = plan_materialization(job, None, NOW, horizon)
    # Another replica, later and with another high-water mark, computes the same due times.
    c = plan_materialization(job, NOW + timedelta(minutes=30), NOW + timedelta(seconds=10), horizon)
    due_a = {r.scheduled_at: r.due_at for r in a.runs}
    assert due_a == {r.scheduled_at: r.due_at for r in b.runs}
    assert all(due_a[r.scheduled_at] == r.due_at for r in c.runs)
    assert len(c.runs) == 90
    offsets = [r.due_at - r.scheduled_at for r in a.runs]
    assert all(timedelta(0) <= o < jitter for o in offsets)
    # It is jitter: the offsets spread out rather than all being one value.
    assert len(set(offsets)) > 100
    assert max(offsets) > jitter / 2


def test_jitter_depends_on_the_job() -> None:
    jitter = timedelta(minutes=5)
    a = plan_materialization(make_job(name="a", jitter=jitter), None, NOW, HORIZON)
    b = plan_materialization(make_job(name="b", jitter=jitter), None, NOW, HORIZON)
    assert [r.due_at for r in a.runs] != [r.due_at for r in b.runs]


def test_no_jitter_means_due_at_the_instant() -> None:
    plan = plan_materialization(make_job(), None, NOW, timedelta(hours=1))
    assert all(r.due_at == r.scheduled_at for r in plan.runs)
    assert len(plan.runs) == 60


# -- one clock: where a new job starts, what is late and what is missed -----------------

SECOND = timedelta(seconds=1)


def test_a_new_job_starts_where_the_database_first_saw_it() -> None:
    """Instants between the job's creation and its first plan are planned, not lost."""
    job = make_job(every=SECOND, catchup=Catchup.NONE)
    created = NOW - timedelta(seconds=3, milliseconds=500)
    plan = plan_materialization(
        job, None, NOW, HORIZON, first_seen=created, on_time=timedelta(seconds=5)
    )
    times = scheduled(plan.runs)
    assert times[:4] == [NOW - 3 * SECOND, NOW - 2 * SECOND, NOW - SECOND, NOW]
    assert min(times) > created  # nothing before the job existed
    assert plan.missed == 0


def test_first_seen_is_never_later_than_now() -> None:
    job = make_job(every=SECOND)
    plan = plan_materialization(job, None, NOW, HORIZON, first_seen=NOW + timedelta(hours=1))
    assert scheduled(plan.runs)[0] == NOW + SECOND


def test_late_by_less_than_on_time_is_kept_older_is_missed() -> None:
    """Under catchup = none an instant a little late is run; one from downtime is not."""
    job = make_job(every=SECOND, catchup=Catchup.NONE)
    on_time = timedelta(seconds=5)
    plan = plan_materialization(job, NOW - timedelta(seconds=20), NOW, HORIZON, on_time=on_time)
    past = [t for t in scheduled(plan.runs) if t < NOW]
    assert past == [NOW - timedelta(seconds=s) for s in range(5, 0, -1)]
    assert plan.missed == 14  # NOW-19s .. NOW-6s


def test_latest_keeps_the_on_time_instants_and_the_newest_missed_one() -> None:
    job = make_job(every=SECOND, catchup=Catchup.LATEST)
    plan = plan_materialization(
        job, NOW - timedelta(seconds=20), NOW, HORIZON, on_time=timedelta(seconds=2)
    )
    past = [t for t in scheduled(plan.runs) if t < NOW]
    assert past == [NOW - 3 * SECOND, NOW - 2 * SECOND, NOW - SECOND]
    assert plan.missed == 16


def test_latest_keeps_no_instant_older_than_its_window_even_when_the_deadline_would_run_it() -> (
    None
):
    """The newest missed instant is kept only inside catchup_window, not merely newest.

    An hourly job down for three hours: its newest missed instant (40 minutes
    ago) lies outside the 10-minute window. A starting deadline of two hours
    would still let the claim run it, so the window is the only guard.
    """
    hourly = timedelta(hours=1)
    job = make_job(
        every=hourly,
        catchup=Catchup.LATEST,
        catchup_window=timedelta(minutes=10),
        starting_deadline=timedelta(hours=2),
    )
    now = NOW + timedelta(minutes=40)
    plan = plan_materialization(job, now - timedelta(hours=3), now, hourly)
    assert scheduled(plan.runs) == [NOW + hourly]  # the future instant only
    assert plan.missed == 3  # NOW - 2h, NOW - 1h, NOW: all older than the window
    assert sum(g.count for g in plan.dropped) == 3

"""The audit of a range and operator times, pure: every due instant accounted for, or flagged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from actors.config import ConfigError, parse_config
from actors.domain import (
    Catchup,
    CronSchedule,
    IntervalSchedule,
    Job,
    PythonSpec,
    RunState,
    plan_materialization,
)
from actors.domain.history import (
    MAX_AUDIT_INSTANTS,
    Gap,
    RangeTooLarge,
    RunRecord,
    Status,
    audit_range,
    parse_instant,
)

BERLIN = ZoneInfo("Europe/Berlin")
NIGHTLY = CronSchedule("0 2 * * *", "Europe/Berlin")
T0 = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)  # 02:00 in Berlin
DAY = timedelta(days=1)
NOW = T0 + 10 * DAY


def record(
    at: datetime,
    state: RunState,
    *,
    trigger: str = "schedule",
    error: str | None = None,
    lease: datetime | None = None,
) -> RunRecord:
    return RunRecord(
        run_id=f"run-{at.isoformat()}",
        scheduled_at=at,
        state=state,
        trigger=trigger,
        attempt=1,
        error=error,
        lease_expires_at=lease,
    )


def statuses(audit: object) -> list[tuple[datetime, Status]]:
    return [(e.scheduled_at, e.status) for e in audit.entries]  # type: ignore[attr-defined]


def test_a_clean_range_is_complete() -> None:
    runs = [record(T0 + i * DAY, RunState.SUCCEEDED) for i in range(5)]
    audit = audit_range(NIGHTLY, T0, T0 + 4 * DAY, NOW, None, runs, [])
    assert [s for _, s in statuses(audit)] == [Status.SUCCEEDED] * 5
    assert audit.complete
    assert audit.due == 5
    assert audit.problems == 0


def test_a_deleted_row_is_missing_and_the_range_incomplete() -> None:
    runs = [record(T0 + i * DAY, RunState.SUCCEEDED) for i in range(5) if i != 2]
    audit = audit_range(NIGHTLY, T0, T0 + 4 * DAY, NOW, None, runs, [])
    assert (T0 + 2 * DAY, Status.MISSING) in statuses(audit)
    assert not audit.complete
    assert audit.problems == 1


def test_a_recorded_gap_explains_the_absence() -> None:
    runs = [record(T0, RunState.SUCCEEDED), record(T0 + 4 * DAY, RunState.SUCCEEDED)]
    gap = Gap(T0 + DAY, T0 + 3 * DAY, 3, "catchup = none: missed while no scheduler ran")
    audit = audit_range(NIGHTLY, T0, T0 + 4 * DAY, NOW, None, runs, [gap])
    dropped = [e for e in audit.entries if e.status is Status.DROPPED]
    assert [e.scheduled_at for e in dropped] == [T0 + DAY, T0 + 2 * DAY, T0 + 3 * DAY]
    assert all(e.reason == gap.reason for e in dropped)
    assert audit.complete


def test_failed_stuck_and_unfinished_runs_are_flagged() -> None:
    runs = [
        record(T0, RunState.FAILED, error="exit 1"),
        record(T0 + DAY, RunState.RUNNING, lease=NOW - timedelta(seconds=1)),
        record(T0 + 2 * DAY, RunState.RUNNING, lease=NOW + timedelta(minutes=1)),
        record(T0 + 3 * DAY, RunState.SKIPPED, error="missed its starting deadline"),
        record(T0 + 4 * DAY, RunState.CANCELLED, error="cancelled by alice"),
    ]
    audit = audit_range(NIGHTLY, T0, T0 + 4 * DAY, NOW, None, runs, [])
    assert [s for _, s in statuses(audit)] == [
        Status.FAILED,
        Status.STUCK,
        Status.IN_PROGRESS,
        Status.SKIPPED,
        Status.CANCELLED,
    ]
    assert audit.entries[0].reason == "exit 1"
    assert audit.entries[3].reason == "missed its starting deadline"
    assert audit.problems == 2
    assert not audit.complete


def test_instants_before_the_schedule_began_or_after_now_are_not_due() -> None:
    since = T0 + 2 * DAY - timedelta(hours=1)
    now = T0 + 3 * DAY + timedelta(hours=1)
    runs = [
        record(T0 + 2 * DAY, RunState.SUCCEEDED),
        record(T0 + 3 * DAY, RunState.SUCCEEDED),
        record(T0 + 4 * DAY, RunState.PENDING),
    ]  # the look-ahead: not due yet
    audit = audit_range(NIGHTLY, T0, T0 + 6 * DAY, now, since, runs, [])
    assert statuses(audit) == [(T0 + 2 * DAY, Status.SUCCEEDED), (T0 + 3 * DAY, Status.SUCCEEDED)]
    assert audit.not_yet_due == 3
    assert audit.complete


def test_rows_off_the_schedule_are_extra_and_do_not_count() -> None:
    manual = T0 + timedelta(hours=5)
    runs = [record(T0, RunState.SUCCEEDED), record(manual, RunState.FAILED, trigger="manual")]
    audit = audit_range(NIGHTLY, T0, T0 + timedelta(hours=6), NOW, None, runs, [])
    assert statuses(audit) == [(T0, Status.SUCCEEDED), (manual, Status.EXTRA)]
    assert audit.due == 1
    assert audit.complete


def test_a_reversed_or_huge_range_is_refused() -> None:
    with pytest.raises(ValueError, match="ends"):
        audit_range(NIGHTLY, T0, T0 - DAY, NOW, None, [], [])
    with pytest.raises(RangeTooLarge, match=str(MAX_AUDIT_INSTANTS)):
        audit_range(IntervalSchedule(timedelta(seconds=1)), T0, T0 + DAY, NOW, None, [], [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01 02:00", datetime(2026, 12, 1, 1, 0, tzinfo=UTC)),  # CET, +01:00
        ("2026-07-01T02:00", datetime(2026, 7, 1, 0, 0, tzinfo=UTC)),  # CEST, +02:00
        ("2026-12-01", datetime(2026, 11, 30, 23, 0, tzinfo=UTC)),  # midnight local
        ("2026-12-01T02:00Z", datetime(2026, 12, 1, 2, 0, tzinfo=UTC)),  # an offset wins
        ("2026-12-01T02:00+05:00", datetime(2026, 11, 30, 21, 0, tzinfo=UTC)),
        ("2026-03-29 02:30", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),  # in the gap: its end
        ("2026-10-25 02:30", datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),  # twice: the first
    ],
)
def test_times_without_an_offset_are_read_in_the_jobs_zone(text: str, expected: datetime) -> None:
    assert parse_instant(text, BERLIN, NOW) == expected


def test_now_and_bad_times() -> None:
    assert parse_instant("now", BERLIN, NOW) == NOW
    with pytest.raises(ValueError, match=r"not an ISO 8601 time.*Europe/Berlin"):
        parse_instant("yesterday", BERLIN, NOW)
    with pytest.raises(ValueError, match="not an ISO 8601 time"):
        parse_instant("2026-13-01", UTC, NOW)


def test_api_tokens_from_a_file_and_the_environment(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# operators\nalice " + "a" * 32 + "\nci-bot " + "b" * 32 + " read\n"
        "ops " + "e" * 32 + " operate\n"
    )
    loaded = parse_config(
        f'[claimd]\napi_token_file = "{tokens}"\napi_token_env = "TOK"\n'
        'api_read_token_env = "READ"\n',
        "c.toml",
        env={"TOK": "c" * 20, "READ": "f" * 20},
    )
    assert loaded.settings.api_tokens == (
        ("alice", "a" * 32, "operate"),
        ("ci-bot", "b" * 32, "read"),
        ("ops", "e" * 32, "operate"),
        ("api", "c" * 20, "operate"),
        ("read", "f" * 20, "read"),
    )
    assert "a" * 32 not in repr(loaded.settings)  # never in a log line of the settings
    bare = tmp_path / "bare"
    bare.write_text("d" * 40 + "\n")
    assert parse_config(
        f'[claimd]\napi_token_file = "{bare}"\n', "c.toml", env={}
    ).settings.api_tokens == (("api", "d" * 40, "operate"),)


@pytest.mark.parametrize(
    ("settings", "env", "field", "words"),
    [
        ('api_token_file = "/nonexistent/token"', {}, "claimd.api_token_file", "cannot read"),
        ('api_token_env = "NOPE"', {}, "claimd.api_token_env", "not set"),
        ('api_token_env = "TOK"', {"TOK": "short"}, "claimd.api_token_env", "shorter than 16"),
        ('api_read_token_env = "NOPE"', {}, "claimd.api_read_token_env", "not set"),
        ('allowed_hosts = ["evil.example:80"]', {}, "claimd.allowed_hosts", "not a host name"),
    ],
)
def test_api_token_mistakes_name_the_field(
    settings: str, env: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[claimd]\n{settings}\n", "c.toml", env=env)
    assert caught.value.field_name == field
    assert words in str(caught.value)
    assert 'short"' not in str(caught.value)
    assert "'short'" not in str(caught.value)


# -- what a plan drops is recorded as gaps ---------------------------------------------------

PLAN_NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _every_minute(catchup: Catchup) -> Job:
    return Job(
        name="report",
        schedule=IntervalSchedule(MINUTE),
        executor=PythonSpec("tests.unit.jobfuncs:sync_job"),
        catchup=catchup,
        catchup_window=timedelta(minutes=30),
    )


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [
        (Catchup.ALL, [(180, 31, 150, "older than catchup_window (30m)")]),
        (
            Catchup.LATEST,
            [
                (180, 31, 150, "older than catchup_window (30m)"),
                (30, 2, 29, "superseded by a later instant (catchup = latest)"),
            ],
        ),
        (Catchup.NONE, [(180, 1, 180, "missed while no scheduler ran (catchup = none)")]),
    ],
)
def test_a_plan_after_downtime_carries_every_dropped_instant_as_gaps(
    catchup: Catchup, expected: list[tuple[int, int, int, str]]
) -> None:
    down_since = PLAN_NOW - timedelta(hours=3, minutes=1)  # 180 instants passed while down
    plan = plan_materialization(_every_minute(catchup), down_since, PLAN_NOW, timedelta(minutes=2))
    got = [
        (int((PLAN_NOW - g.first) / MINUTE), int((PLAN_NOW - g.last) / MINUTE), g.count, g.reason)
        for g in plan.dropped
    ]
    assert [(a, b, n) for a, b, n, _ in got] == [(a, b, n) for a, b, n, _ in expected]
    assert all(want in reason for (*_, reason), (*_, want) in zip(got, expected, strict=True))
    assert sum(g.count for g in plan.dropped) == plan.missed
    # Every instant of the downtime is a planned run or in exactly one gap.
    planned = {r.scheduled_at for r in plan.runs}
    past = [down_since + k * MINUTE for k in range(1, 181)]
    in_gaps = [t for t in past if any(g.first <= t <= g.last for g in plan.dropped)]
    assert sorted([*(planned & set(past)), *in_gaps]) == past
    assert not planned & set(in_gaps)


def test_a_plan_without_downtime_drops_nothing() -> None:
    plan = plan_materialization(
        _every_minute(Catchup.NONE), PLAN_NOW - MINUTE / 2, PLAN_NOW, timedelta(minutes=2)
    )
    assert plan.dropped == ()
    assert plan.missed == 0

"""Scheduling semantics on the real servers: DST, catch-up, start deadline, overlap, retries,
timeouts.

Time-dependent planning is driven by an injected clock (no waiting for hours);
everything distributed runs through real replicas on PostgreSQL and JetStream,
and is judged by the rows in ``job_runs`` / ``job_run_attempts`` and by what
the jobs themselves recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import psutil
import pytest

from actors.adapters.postgres import Operations, PostgresRunStore
from actors.config import LoadedConfig
from actors.domain import Catchup, CronSchedule, IntervalSchedule, Job, PythonSpec
from actors.replica import Replica
from actors.scheduling.materializer import Materializer
from tests.integration.helpers import RARE_CRON, counter, eventually, running
from tests.integration.semantics_jobs import executed_run_ids, executions

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = {
    "claim_interval": "50ms",
    "materialize_interval": "200ms",
    "reap_interval": "200ms",
    "shutdown_grace": "5s",
}
RECORD = "tests.integration.semantics_jobs:record"


class FakeClock:
    """The materializer's (the database's) clock, moved by the test.

    Materializers driven by it run with ``guard_stale_plans=False``: the
    database's own now() cannot agree with a clock the test moves.
    """

    def __init__(self, now: datetime) -> None:
        self.current = now

    async def read(self) -> datetime:
        return self.current


async def _rows(store: PostgresRunStore, job: str) -> list[asyncpg.Record]:
    return list(
        await store.pool.fetch(
            "SELECT r.id::text AS id, r.scheduled_at, r.state, r.attempt, r.outcome, r.error, "
            "r.exit_code, r.claim_epoch, r.started_at, r.finished_at, r.trigger "
            "FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE j.name = $1 "
            "ORDER BY r.scheduled_at",
            job,
        )
    )


async def _run(store: PostgresRunStore, run_id: str) -> asyncpg.Record:
    row = await store.pool.fetchrow(
        "SELECT id::text AS id, state, attempt, outcome, error, exit_code, claim_epoch, "
        "started_at, finished_at, scheduled_at FROM job_runs WHERE id = $1::uuid",
        run_id,
    )
    assert row is not None
    return row


async def _attempts(store: PostgresRunStore, run_id: str) -> list[asyncpg.Record]:
    return list(
        await store.pool.fetch(
            "SELECT attempt, outcome, error, worker FROM job_run_attempts "
            "WHERE run_id = $1::uuid ORDER BY attempt",
            run_id,
        )
    )


async def _wait_terminal(store: PostgresRunStore, run_id: str, timeout: float = 30.0) -> None:
    async def terminal() -> bool:
        state = await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1::uuid", run_id)
        return state in ("succeeded", "failed", "skipped", "cancelled")

    await eventually(terminal, timeout=timeout, what=f"run {run_id} to end")


# --- 1. time zones and DST, on the materialized rows -------------------------------------


def _local(instant: datetime, zone: ZoneInfo) -> str:
    return instant.astimezone(zone).isoformat(timespec="minutes")


# (zone, transition day, the daily "30 2 * * *" instants on the day before / of / after,
#  the "*/30" rows around the change as local wall-clock times, their UTC span,
#  and how many "*/30" rows the transition day has)
DST_CASES = [
    pytest.param(
        "Europe/Berlin",
        date(2026, 3, 29),
        ["2026-03-28T01:30:00+00:00", "2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"],
        # 02:00 and 02:30 do not exist: they fire once, at 03:00, the end of the gap.
        [
            "2026-03-29T00:30+01:00",
            "2026-03-29T01:00+01:00",
            "2026-03-29T01:30+01:00",
            "2026-03-29T03:00+02:00",
            "2026-03-29T03:30+02:00",
            "2026-03-29T04:00+02:00",
        ],
        ("2026-03-28T23:30:00+00:00", "2026-03-29T02:00:00+00:00"),
        46,
        id="berlin-spring-forward",
    ),
    pytest.param(
        "Europe/Berlin",
        date(2026, 10, 25),
        ["2026-10-24T00:30:00+00:00", "2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"],
        # 02:00 and 02:30 happen twice: "*/30" (a wildcard hour) fires at both
        # occurrences (cron(8)); the daily 02:30, a fixed time, at the first.
        [
            "2026-10-25T01:30+02:00",
            "2026-10-25T02:00+02:00",
            "2026-10-25T02:30+02:00",
            "2026-10-25T02:00+01:00",
            "2026-10-25T02:30+01:00",
            "2026-10-25T03:00+01:00",
            "2026-10-25T03:30+01:00",
        ],
        ("2026-10-24T23:30:00+00:00", "2026-10-25T02:30:00+00:00"),
        50,
        id="berlin-fall-back",
    ),
    pytest.param(
        "America/New_York",
        date(2026, 3, 8),
        ["2026-03-07T07:30:00+00:00", "2026-03-08T07:00:00+00:00", "2026-03-09T06:30:00+00:00"],
        [
            "2026-03-08T01:00-05:00",
            "2026-03-08T01:30-05:00",
            "2026-03-08T03:00-04:00",
            "2026-03-08T03:30-04:00",
        ],
        ("2026-03-08T06:00:00+00:00", "2026-03-08T07:30:00+00:00"),
        46,
        id="new-york-spring-forward",
    ),
    pytest.param(
        "America/New_York",
        date(2026, 11, 1),
        ["2026-10-31T06:30:00+00:00", "2026-11-01T07:30:00+00:00", "2026-11-02T07:30:00+00:00"],
        [
            "2026-11-01T00:30-04:00",
            "2026-11-01T01:00-04:00",
            "2026-11-01T01:30-04:00",
            "2026-11-01T01:00-05:00",
            "2026-11-01T01:30-05:00",
            "2026-11-01T02:00-05:00",
            "2026-11-01T02:30-05:00",
        ],
        ("2026-11-01T04:30:00+00:00", "2026-11-01T07:30:00+00:00"),
        50,
        id="new-york-fall-back",
    ),
]


@pytest.mark.parametrize(("zone_name", "day", "daily", "around", "span", "day_count"), DST_CASES)
async def test_dst_rows_follow_cron8s_rule(
    store: PostgresRunStore,
    zone_name: str,
    day: date,
    daily: list[str],
    around: list[str],
    span: tuple[str, str],
    day_count: int,
) -> None:
    zone = ZoneInfo(zone_name)
    jobs = {
        "daily": Job(
            name="daily",
            schedule=CronSchedule("30 2 * * *", zone_name),
            executor=PythonSpec(RECORD),
        ),
        "half-hourly": Job(
            name="half-hourly",
            schedule=CronSchedule("*/30 * * * *", zone_name),
            executor=PythonSpec(RECORD),
        ),
    }
    await store.sync_jobs(list(jobs.values()))
    # Judge the local days before, of and after the change; tick across them.
    first = datetime.combine(day - timedelta(days=1), time(0), zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=2), time(0), zone).astimezone(UTC)
    clock = FakeClock(first - timedelta(hours=1))
    materializer = Materializer(
        store,
        clock,
        timedelta(hours=12),
        timedelta(seconds=1),
        asyncio.Event(),
        guard_stale_plans=False,
    )
    while clock.current < end:
        await materializer.tick()
        clock.current += timedelta(hours=6)

    async def instants(job: str) -> list[datetime]:
        return [
            r["scheduled_at"] for r in await _rows(store, job) if first <= r["scheduled_at"] < end
        ]

    assert [t.isoformat() for t in await instants("daily")] == daily

    half = await instants("half-hourly")
    assert len(half) == len(set(half))
    lo, hi = (datetime.fromisoformat(s) for s in span)
    assert [_local(t, zone) for t in half if lo <= t <= hi] == around
    per_day: dict[date, int] = {}
    for t in half:
        per_day[t.astimezone(zone).date()] = per_day.get(t.astimezone(zone).date(), 0) + 1
    assert per_day == {day - timedelta(days=1): 48, day: day_count, day + timedelta(days=1): 48}
    # Independently of the rule's wording: every real half hour fires (cron(8): a
    # wildcard hour runs at every real instant whose wall time matches; in these
    # zones every UTC half hour is a local :00 or :30).
    expected = []
    t = first
    while t < end:
        expected.append(t)
        t += timedelta(minutes=30)
    assert half == expected


# --- 2. catch-up after downtime, and the starting deadline -------------------------------

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _at(hours: int, minutes: int) -> datetime:
    return T0 + timedelta(hours=hours, minutes=minutes)


async def test_catchup_all_latest_none_after_downtime(store: PostgresRunStore) -> None:
    jobs = {
        f"catchup-{mode.value}": Job(
            name=f"catchup-{mode.value}",
            schedule=IntervalSchedule(timedelta(minutes=15)),
            executor=PythonSpec(RECORD),
            catchup=mode,
            catchup_window=timedelta(hours=2),
        )
        for mode in Catchup
    }
    await store.sync_jobs(list(jobs.values()))
    clock = FakeClock(T0)
    horizon = timedelta(minutes=30)
    await Materializer(
        store, clock, horizon, timedelta(seconds=1), asyncio.Event(), guard_stale_plans=False
    ).tick()
    before = {name: counter("claimd_runs_missed_total", claimd_job=name) for name in jobs}

    # The scheduler is down for five hours; a new one starts with the clock moved on.
    clock.current = T0 + timedelta(hours=5, minutes=1)
    await Materializer(
        store, clock, horizon, timedelta(seconds=1), asyncio.Event(), guard_stale_plans=False
    ).tick()

    before_downtime = [_at(0, 15), _at(0, 30)]
    after_restart = [_at(5, 15), _at(5, 30)]
    # Missed instants 12:45 .. 17:00 (18 of them); the window keeps those >= 15:01.
    in_window = [_at(3, 15) + timedelta(minutes=15 * i) for i in range(8)]
    assert in_window[-1] == _at(5, 0)
    expected = {
        "catchup-all": before_downtime + in_window + after_restart,
        "catchup-latest": [*before_downtime, _at(5, 0), *after_restart],
        "catchup-none": before_downtime + after_restart,
    }
    for name, instants in expected.items():
        assert [r["scheduled_at"] for r in await _rows(store, name)] == instants, name
    missed = {
        name: counter("claimd_runs_missed_total", claimd_job=name) - before[name] for name in jobs
    }
    assert missed == {"catchup-all": 10, "catchup-latest": 17, "catchup-none": 18}
    marks = await store.pool.fetch("SELECT materialized_until FROM jobs")
    # Planned to now + horizon (17:31), the mark then just before the next instant.
    assert {r["materialized_until"] for r in marks} == {_at(5, 45) - timedelta(microseconds=1)}


async def test_run_past_its_starting_deadline_is_skipped_and_never_executed(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        f"""
        [jobs.deadline]
        cron = "{RARE_CRON}"
        starting_deadline = "30s"
        run = {{ python = "{RECORD}" }}
    """,
        **FAST,
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    job_id = await store.pool.fetchval("SELECT id FROM jobs WHERE name = 'deadline'")
    insert = (
        "INSERT INTO job_runs (job_id, scheduled_at, due_at) "
        "VALUES ($1, now() - $2::interval, now() - $2::interval) RETURNING id::text"
    )
    late = await store.pool.fetchval(insert, job_id, timedelta(minutes=5))
    on_time = await store.pool.fetchval(insert, job_id, timedelta(seconds=1))

    async with running(Replica(Path(loaded.path), loaded)):
        # The late run is due first: once the later one is done, it has been judged.
        await _wait_terminal(store, on_time)

    assert (await _run(store, on_time))["state"] == "succeeded"
    row = await _run(store, late)
    assert row["state"] == "skipped"
    assert "deadline" in row["error"]
    assert row["started_at"] is None
    assert row["claim_epoch"] == 0  # never claimed
    assert late not in executed_run_ids("deadline")
    assert on_time in executed_run_ids("deadline")
    assert await _attempts(store, late) == []


# --- 3. overlap: forbid and queue, across two replicas ------------------------------------


def _assert_disjoint(intervals: list[tuple[Any, Any]], what: str) -> None:
    ordered = sorted(intervals, key=lambda i: i[0])
    for (s1, e1), (s2, e2) in itertools.pairwise(ordered):
        assert e1 <= s2, f"{what}: [{s1}, {e1}] overlaps [{s2}, {e2}]"


async def _run_two_replicas_until(loaded: LoadedConfig, job: str, executed: int) -> None:
    path = Path(loaded.path)
    async with running(Replica(path, loaded), Replica(path, loaded)):

        async def enough() -> bool:
            return len(executions(job)) >= executed

        await eventually(enough, timeout=60, what=f"{executed} executions of {job}")


async def test_overlap_forbid_across_two_replicas_never_overlaps_and_records_skips(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        """
        [jobs.forbid-slow]
        every = "1s"
        overlap = "forbid"
        timeout = "30s"
        run = { python = "tests.integration.semantics_jobs:slow" }
    """,
        **FAST,
    )
    await _run_two_replicas_until(loaded, "forbid-slow", 3)

    mine = executions("forbid-slow")
    _assert_disjoint([(e.started, e.ended) for e in mine], "job's own records")
    rows = await _rows(store, "forbid-slow")
    done = [r for r in rows if r["state"] == "succeeded"]
    assert len(done) >= 3
    _assert_disjoint([(r["started_at"], r["finished_at"]) for r in done], "job_runs")
    assert {r["id"] for r in done} == {e.run_id for e in mine}
    skipped = [r for r in rows if r["state"] == "skipped"]
    # A 1 s period and 2.5 s runs: the instants due meanwhile are skipped, with the reason.
    assert len(skipped) >= 2
    assert {r["error"] for r in skipped} == {"overlap forbidden: an earlier run was still active"}
    assert not {r["id"] for r in skipped} & executed_run_ids("forbid-slow")


async def test_overlap_queue_across_two_replicas_waits_in_order_without_skips(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        """
        [jobs.queue-slow]
        every = "1s"
        overlap = "queue"
        timeout = "30s"
        run = { python = "tests.integration.semantics_jobs:slow" }
    """,
        **FAST,
    )
    await _run_two_replicas_until(loaded, "queue-slow", 3)

    mine = executions("queue-slow")
    _assert_disjoint([(e.started, e.ended) for e in mine], "job's own records")
    rows = await _rows(store, "queue-slow")
    done = [r for r in rows if r["state"] == "succeeded"]
    _assert_disjoint([(r["started_at"], r["finished_at"]) for r in done], "job_runs")
    states = [r["state"] for r in rows]
    assert "skipped" not in states
    # The queue runs the instants in order: succeeded ones first, then at most one
    # still active, then the waiting ones (several, since each run outlasts its period).
    n = len(done)
    assert n >= 3
    assert states[:n] == ["succeeded"] * n
    rest = states[n:]
    active = [s for s in rest if s in ("claimed", "running")]
    assert len(active) <= 1
    assert [s for s in rest if s not in ("claimed", "running")] == ["pending"] * (
        len(rest) - len(active)
    )
    due_waiting = await store.pool.fetchval(
        "SELECT count(*) FROM job_runs WHERE state = 'pending' AND due_at <= now()"
    )
    assert due_waiting >= 1


async def test_forbid_is_enforced_by_the_database_against_racing_claims(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, schema_url: str
) -> None:
    loaded = make_config(f"""
        [jobs.forbid-race]
        cron = "{RARE_CRON}"
        overlap = "forbid"
        run = {{ python = "{RECORD}" }}
    """)
    await store.sync_jobs(list(loaded.jobs.values()))
    job_id = await store.pool.fetchval("SELECT id FROM jobs WHERE name = 'forbid-race'")
    await store.pool.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at) "
        "SELECT $1, now() - g * interval '1 ms', now() - g * interval '1 ms' "
        "FROM generate_series(1, 20) g",
        job_id,
    )
    stores = [await PostgresRunStore.connect(schema_url, max_size=2) for _ in range(6)]
    try:
        claimed = await asyncio.gather(
            *(
                s.claim_due_runs(f"replica-{i}", 10, timedelta(minutes=1), 100)
                for i, s in enumerate(stores)
                for _ in range(3)
            )
        )
    finally:
        for s in stores:
            await s.close()
    assert sum(len(c) for c in claimed) == 1
    active = await store.pool.fetch("SELECT id FROM job_runs WHERE state IN ('claimed', 'running')")
    assert len(active) == 1
    # Even a statement that ignores the claimer's checks cannot activate a second run.
    with pytest.raises(asyncpg.UniqueViolationError):
        await store.pool.execute(
            "UPDATE job_runs SET state = 'claimed', exclusive = true, lease_owner = 'rogue', "
            "lease_expires_at = now() + interval '1 minute', claim_epoch = claim_epoch + 1 "
            "WHERE id = (SELECT id FROM job_runs WHERE state = 'pending' LIMIT 1)"
        )


# --- 4. retries with backoff --------------------------------------------------------------


async def test_fails_twice_then_succeeds_with_three_attempts_and_fails_with_two(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    body = f"""
        cron = "{RARE_CRON}"
        backoff = {{ initial = "100ms", max = "200ms" }}
        run = {{ python = "tests.integration.semantics_jobs:fails_twice" }}
    """
    loaded = make_config(
        f"[jobs.flaky-3]\nmax_attempts = 3\n{body}\n[jobs.flaky-2]\nmax_attempts = 2\n{body}",
        **FAST,
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    ops = Operations(store.pool)
    async with running(Replica(Path(loaded.path), loaded)):
        at = datetime.now(UTC).replace(microsecond=0)
        three = await ops.trigger("flaky-3", at)
        two = await ops.trigger("flaky-2", at)
        assert three is not None
        assert two is not None
        await _wait_terminal(store, three)
        await _wait_terminal(store, two)

    row = await _run(store, three)
    assert (row["state"], row["attempt"], row["outcome"]) == ("succeeded", 3, "succeeded")
    assert len(await _rows(store, "flaky-3")) == 1
    history = await _attempts(store, three)
    assert [(a["attempt"], a["outcome"]) for a in history] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]
    assert "planned failure number 1" in history[0]["error"]
    assert "planned failure number 2" in history[1]["error"]
    assert history[2]["error"] is None
    assert [e.attempt for e in executions("flaky-3") if e.run_id == three] == [1, 2, 3]

    row = await _run(store, two)
    assert (row["state"], row["attempt"], row["outcome"]) == ("failed", 2, "failed")
    assert "planned failure number 2" in row["error"]
    assert row["finished_at"] is not None
    history = await _attempts(store, two)
    assert [(a["attempt"], a["outcome"]) for a in history] == [(1, "failed"), (2, "failed")]
    assert [e.attempt for e in executions("flaky-2") if e.run_id == two] == [1, 2]


# --- 5. timeout of a shell job with a child -----------------------------------------------


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


async def test_shell_timeout_kills_the_process_group_and_records_timed_out(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    script = f"sleep 60 & echo $! > {tmp_path}/child.pid; echo $$ > {tmp_path}/parent.pid; wait"
    loaded = make_config(
        f"""
        [jobs.sleepy]
        cron = "{RARE_CRON}"
        timeout = "1s"
        max_attempts = 1
        run = {{ shell = "{script}", use_shell = true }}
    """,
        **FAST,
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    procs: list[psutil.Process] = []
    try:
        async with running(Replica(Path(loaded.path), loaded)):
            run_id = await Operations(store.pool).trigger("sleepy", datetime.now(UTC))
            assert run_id is not None

            async def started() -> bool:
                return all(_pid_in(tmp_path / f) for f in ("parent.pid", "child.pid"))

            await eventually(started, timeout=30, what="the shell job to start")
            # Process objects remember their start time: no mix-up with a reused pid.
            procs = [psutil.Process(_pid_in(tmp_path / f)) for f in ("parent.pid", "child.pid")]
            await _wait_terminal(store, run_id)
        row = await _run(store, run_id)
        assert (row["state"], row["outcome"]) == ("failed", "timed_out")
        assert "timed out" in row["error"]
        assert [(a["attempt"], a["outcome"]) for a in await _attempts(store, run_id)] == [
            (1, "timed_out")
        ]
        assert [p.pid for p in procs if not _gone(p)] == []
    finally:
        for proc in procs:  # never leave a stray sleeper behind, whatever failed above
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()

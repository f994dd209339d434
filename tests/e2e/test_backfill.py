"""`claimd backfill` through the real entry point: a range of any length, or a clear refusal.

Before the fix a backfill stopped silently at 100,000 instants, said "100000
runs added", and a rerun added 0: the rest of the range could never be filled.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from tests.e2e.helpers import (
    ClaimdProcess,
    child_env,
    claimd_command,
    eventually,
    query,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# 200,000 instants of a job every second: 55 h 33 min 20 s, both ends included.
START = datetime(2020, 3, 1, tzinfo=UTC)
INSTANTS = 200_000
END = START + timedelta(seconds=INSTANTS - 1)


async def _claimd(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [*claimd_command(), *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=90,
        check=False,
    )


async def _rows(store: PostgresRunStore) -> tuple[int, int, datetime | None, datetime | None]:
    row = await store.pool.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT scheduled_at) AS d, min(scheduled_at) AS lo, "
        "max(scheduled_at) AS hi FROM job_runs WHERE trigger = 'backfill'"
    )
    assert row is not None
    return row["n"], row["d"], row["lo"], row["hi"]


@pytest.fixture
async def beat(store: PostgresRunStore, make_config: Callable[..., LoadedConfig]) -> str:
    """A job every second, written to the test's schema as a replica would."""
    loaded = make_config("""
        [jobs.beat]
        every = "1s"
        run = { shell = ["/bin/true"] }
    """)
    await store.sync_jobs(list(loaded.jobs.values()))
    return "beat"


async def test_a_200000_instant_backfill_fills_the_whole_range_and_a_rerun_adds_nothing(
    store: PostgresRunStore, schema_url: str, beat: str
) -> None:
    args = (
        "backfill",
        beat,
        "--from",
        START.isoformat(),
        "--to",
        END.isoformat(),
        "--database-url",
        schema_url,
    )
    first = await _claimd(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        f"backfilled beat: 200,000 instants from {START.isoformat()} to {END.isoformat()}: "
        "200,000 runs added, 0 already had a run"
    )
    assert await _rows(store) == (INSTANTS, INSTANTS, START, END)
    # Progress, chunk by chunk, on stderr: the last line reaches the end of the range.
    progress = [line for line in first.stderr.splitlines() if line.startswith("backfill beat:")]
    assert len(progress) == 20, first.stderr
    assert progress[-1] == (
        f"backfill beat: 200,000/200,000 instants (through {END.isoformat()}), 200,000 added"
    )

    again = await _claimd(*args)
    assert again.returncode == 3, again.stderr  # nothing to do
    assert again.stdout.strip().endswith("0 runs added, 200,000 already had a run")
    assert await _rows(store) == (INSTANTS, INSTANTS, START, END)


async def test_a_backfill_over_the_limit_is_refused_up_front_and_adds_nothing(
    store: PostgresRunStore, schema_url: str, beat: str
) -> None:
    # The default limit (1,000,000): 23 days of a job every second is refused.
    far = START + timedelta(days=23)
    refused = await _claimd(
        "backfill",
        beat,
        "--from",
        START.isoformat(),
        "--to",
        far.isoformat(),
        "--database-url",
        schema_url,
    )
    assert refused.returncode == 2, refused.stderr
    errors = refused.stderr.strip().splitlines()
    assert len(errors) == 1, refused.stderr
    assert errors[0].startswith(
        "error: backfill of 'beat' covers 1,987,201 instants, over "
        "the limit of 1,000,000 runs per backfill"
    ), errors[0]
    assert "nothing added" in errors[0]
    assert "--max-runs" in errors[0]
    assert refused.stdout == ""

    # A lower limit, named on the command line, refuses the 200,000-instant range.
    lowered = await _claimd(
        "backfill",
        beat,
        "--from",
        START.isoformat(),
        "--to",
        END.isoformat(),
        "--max-runs",
        "150000",
        "--database-url",
        schema_url,
    )
    assert lowered.returncode == 2, lowered.stderr
    assert "covers 200,000 instants, over the limit of 150,000" in lowered.stderr
    assert await _rows(store) == (0, 0, None, None)


async def test_backfill_arguments_that_cannot_be_acted_on_are_one_line_and_exit_2(
    store: PostgresRunStore, schema_url: str, beat: str
) -> None:
    cases = {
        ("--from", "yesterday", "--to", END.isoformat()): "from 'yesterday' is not an ISO 8601",
        ("--from", END.isoformat(), "--to", START.isoformat()): "is after to",
    }
    for times, expected in cases.items():
        result = await _claimd("backfill", beat, *times, "--database-url", schema_url)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert expected in result.stderr, result.stderr
    bad_limit = await _claimd(
        "backfill",
        beat,
        "--from",
        START.isoformat(),
        "--to",
        END.isoformat(),
        "--max-runs",
        "0",
        "--database-url",
        schema_url,
    )
    assert bad_limit.returncode == 2
    assert "--max-runs: expected a positive whole number" in bad_limit.stderr
    assert await _rows(store) == (0, 0, None, None)


async def test_a_backfill_reaching_past_now_or_before_2000_is_refused_as_a_trigger_is(
    store: PostgresRunStore, schema_url: str, beat: str
) -> None:
    # A run backfilled for an instant still ahead would run now and use that instant
    # up: its scheduled run would never happen. Refused, with the reason, as trigger.
    soon = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    a_minute_ago = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    cases = {
        ("--from", a_minute_ago, "--to", soon): "is later than now",
        ("--from", "2999-01-01T00:00Z", "--to", "2999-01-02T00:00Z"): "is later than now",
        ("--from", "1999-12-31T23:59Z", "--to", START.isoformat()): "before 2000-01-01",
        ("--from", "0001-01-01T00:00+05:00", "--to", END.isoformat()): "outside the years",
        ("--from", END.isoformat(), "--to", "9999-12-31T23:59-05:00"): "outside the years",
    }
    for times, expected in cases.items():
        result = await _claimd("backfill", beat, *times, "--database-url", schema_url)
        assert result.returncode == 2, (times, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr
        assert expected in result.stderr, (times, result.stderr)
        assert result.stdout == ""
    assert await _rows(store) == (0, 0, None, None)
    later = await _claimd(
        "backfill", beat, "--from", END.isoformat(), "--to", soon, "--database-url", schema_url
    )
    assert "end the range at or before now (--to now); nothing added" in later.stderr
    # --to now is accepted: the range up to the database's now.
    recent = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    upto = await _claimd(
        "backfill", beat, "--from", recent, "--to", "now", "--database-url", schema_url
    )
    assert upto.returncode == 0, upto.stderr
    added, _, _, last = await _rows(store)
    assert added >= 30
    assert last is not None
    assert last <= datetime.now(UTC)


# -- a job with overlap = forbid: every backfilled instant runs, one after another ------

DAY = datetime(2026, 12, 1, tzinfo=UTC)


async def test_a_backfill_of_a_forbid_job_runs_every_instant_one_after_another(
    tmp_path: Path, schema_url: str, nats_url: str, deployment: str
) -> None:
    """24 hourly instants of a forbid job, backfilled through `claimd backfill` beside two
    real replicas: 24 executions, none overlapping another, in instant order, none
    skipped. A trigger while one of them runs says it waits its turn; one asking for
    forbid is refused instead of being skipped silently.

    Before the fix the backfill said "24 runs added" and 23 of them were skipped
    "overlap forbidden: an earlier run was still active".
    """
    effects, gate = tmp_path / "effects", tmp_path / "go"
    # Each execution writes its run, then waits for the gate: the first one holds
    # until the test has triggered beside it; afterwards the gate is open.
    command = (
        f'echo "$CLAIMD_RUN_ID $CLAIMD_SCHEDULED_AT start" >> {effects}; '
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        f'echo "$CLAIMD_RUN_ID $CLAIMD_SCHEDULED_AT end" >> {effects}'
    )
    # Hourly on 1 December only: its own schedule adds no run while the test runs.
    config = write_config(
        tmp_path / "claimd.toml",
        jobs=(
            '[jobs.hourly]\ncron = "0 * 1 12 *"\noverlap = "forbid"\ntimeout = "30s"\n'
            f"run = {{ shell = {json.dumps(command)}, use_shell = true }}\n"
        ),
        database_url=schema_url,
        nats_url=nats_url,
        deployment=deployment,
        http="127.0.0.1:0",
        claim_interval="100ms",
    )
    replicas = [
        ClaimdProcess(["run", "--config", str(config)], tmp_path, f"r{i}").start() for i in range(2)
    ]
    try:

        async def up() -> bool:
            for r in replicas:
                assert r.returncode() is None, r.stderr()[-3000:]
            return all(r.events("replica started") for r in replicas)

        await eventually(up, timeout=60, what="two replicas to start")
        last = DAY + timedelta(hours=23)
        added = await _claimd(
            "backfill",
            "hourly",
            "--from",
            "2026-12-01T00:00Z",
            "--to",
            "2026-12-01T23:00Z",
            "--config",
            str(config),
        )
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == (
            f"backfilled hourly: 24 instants from {DAY.isoformat()} to {last.isoformat()}: "
            "24 runs added, 0 already had a run; overlap queue: they run one after another"
        )
        backfilled = await query(
            schema_url, "SELECT overlap, count(*) AS n FROM job_runs GROUP BY overlap"
        )
        assert [(r["overlap"], r["n"]) for r in backfilled] == [("queue", 24)]

        async def first_running() -> bool:
            rows = await query(schema_url, "SELECT id::text FROM job_runs WHERE state = 'running'")
            return len(rows) == 1 and rows[0]["id"] is not None

        await eventually(first_running, timeout=30, what="the first backfilled run to start")
        [active] = await query(
            schema_url, "SELECT id::text AS id, scheduled_at FROM job_runs WHERE state = 'running'"
        )
        assert active["scheduled_at"] == DAY  # the oldest instant first

        refused = await _claimd("trigger", "hourly", "--overlap", "forbid", "--config", str(config))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert (
            f"hourly has run {active['id']} running and overlap forbid: a run triggered now "
            "would be skipped; nothing added"
        ) in refused.stderr
        triggered = await _claimd("trigger", "hourly", "--config", str(config))
        assert triggered.returncode == 0, triggered.stderr
        assert triggered.stdout.strip().endswith(
            f"; overlap queue: it waits its turn, hourly's run {active['id']} is running"
        ), triggered.stdout
        gate.touch()

        async def all_done() -> bool:
            for r in replicas:
                assert r.returncode() is None, r.stderr()[-3000:]
            rows = await query(
                schema_url,
                "SELECT count(*) AS n FROM job_runs "
                "WHERE state NOT IN ('succeeded', 'failed', 'skipped', 'cancelled')",
            )
            return bool(rows[0]["n"] == 0)

        await eventually(all_done, timeout=60, what="every run to finish")
        rows = await query(
            schema_url,
            "SELECT r.id::text AS id, r.scheduled_at, r.trigger, r.state, r.error, "
            "r.started_at, r.finished_at, "
            "(SELECT count(*) FROM job_run_attempts a WHERE a.run_id = r.id) AS attempts "
            "FROM job_runs r ORDER BY r.started_at",
        )
    finally:
        for r in replicas:
            r.terminate()
        for r in replicas:
            await r.wait(30)

    ran = [r for r in rows if r["trigger"] == "backfill"]
    assert [r["scheduled_at"] for r in ran] == [DAY + timedelta(hours=h) for h in range(24)]
    assert all((r["state"], r["attempts"]) == ("succeeded", 1) for r in rows), [
        (r["scheduled_at"], r["state"], r["error"]) for r in rows if r["state"] != "succeeded"
    ]
    assert [r["trigger"] for r in rows][-1] == "manual"  # queued behind the backfill
    # One after another: each run started after the one before it finished.
    overlaps = [
        (a["scheduled_at"], b["scheduled_at"])
        for a, b in itertools.pairwise(rows)
        if b["started_at"] < a["finished_at"]
    ]
    assert overlaps == []
    # Each execution once, and whole: its start and end lines, no other run's between.
    lines = [line.split() for line in effects.read_text().splitlines()]
    assert len(lines) == 2 * len(rows) == 50
    for (start_id, _, start), (end_id, _, end) in zip(lines[::2], lines[1::2], strict=True):
        assert (start_id, start, end) == (end_id, "start", "end")
    assert [ln[0] for ln in lines[::2]] == [r["id"] for r in rows]
    span = rows[-1]["finished_at"] - rows[0]["started_at"]
    print(f"\n[backfill forbid] 24 backfilled + 1 triggered runs, one after another in {span}")

"""`claimd backfill` through the real entry point: a range of any length, or a clear refusal.

Before the fix a backfill stopped silently at 100,000 instants, said "100000
runs added", and a rerun added 0: the rest of the range could never be filled.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from tests.e2e.helpers import child_env, claimd_command

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

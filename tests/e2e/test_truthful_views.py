"""What `claimd` shows is what happened, through the real command against a seeded database.

Listings default to what has happened (the look-ahead on request); the last
outcome is over instants at or before now; a paused job has no next fire and
nothing overdue; `show` lists every attempt, the running and a cancelled one
too; durations read `5s`, `1m 5s`; the audit says paused, pruned, and when the
asked-for time is not an instant of the schedule; control characters from a
job's output and errors reach the terminal escaped.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import parse_config
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

JOBS = """
[jobs.tick]
every = "5s"
run = { shell = ["/bin/true"] }

[jobs.nightly]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.held]
every = "10m"
run = { shell = ["/bin/true"] }

[jobs.first]
every = "1h"
run = { shell = ["/bin/true"] }
"""
PAST = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)  # 02:00 in Berlin
# A timedelta printed raw ("0:01:05", "1 day, 2:03:04.5"): digits:MM:SS not
# followed by the Z of a UTC wall-clock time.
TIMEDELTA_TEXT = re.compile(r"(?<![\d:])\d+:\d\d:\d\d(?![\dZ+-])")
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\r\x9b31m"


async def run_row(store: PostgresRunStore, job: str, at: datetime, **values: Any) -> str:
    """A job_runs row of ``job`` at ``at`` with ``values`` (state pending by default)."""
    columns = ["job_id", "scheduled_at", "due_at", *values]
    params = ", ".join(f"${i}" for i in range(4, 4 + len(values)))
    run_id: str = await store.pool.fetchval(
        f"INSERT INTO job_runs ({', '.join(columns)}) "
        f"SELECT id, $2, $3{', ' + params if values else ''} FROM jobs WHERE name = $1 "
        "RETURNING id::text",
        job,
        at,
        at,
        *values.values(),
    )
    return run_id


@pytest.fixture
async def seeded(store: PostgresRunStore, schema_url: str) -> dict[str, Any]:
    loaded = parse_config(JOBS, "jobs.toml", env={})
    await store.sync_jobs(list(loaded.jobs.values()))
    now: datetime = await store.pool.fetchval("SELECT now()")
    await store.pool.execute("UPDATE jobs SET created_at = $1", now - timedelta(days=400))
    ids: dict[str, Any] = {"db": schema_url, "now": now}
    # nightly: succeeded at 02:00 on 1 January; a future run cancelled (a removal).
    ids["past"] = await run_row(
        store, "nightly", PAST, state="succeeded", outcome="succeeded", finished_at=PAST
    )
    await run_row(
        store,
        "nightly",
        now + timedelta(days=1),
        state="cancelled",
        outcome="cancelled",
        error="job removed from config",
        finished_at=now,
    )
    # tick: one run done five seconds ago, one written ahead for a minute from now.
    done_at = now - timedelta(seconds=5)
    ids["done"] = await run_row(
        store, "tick", done_at, state="succeeded", outcome="succeeded", finished_at=done_at
    )
    ids["ahead"] = await run_row(store, "tick", now + timedelta(seconds=60))
    # A run on its second attempt: the first failed (recorded), the second runs.
    second = now - timedelta(seconds=65)
    ids["running"] = await run_row(
        store,
        "tick",
        now - timedelta(seconds=70),
        state="running",
        attempt=2,
        claim_epoch=2,
        lease_owner="worker-b",
        lease_expires_at=now + timedelta(minutes=2),
        started_at=second,
        outcome="failed",
        error="attempt one " + ESCAPES,
        output_tail="progress " + ESCAPES + "\n",
    )
    await store.pool.execute(
        "INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, "
        "finished_at, outcome, exit_code, error) "
        "VALUES ($1::uuid, 1, 1, 'worker-a', $2, $3, 'failed', 3, 'attempt one')",
        ids["running"],
        second - timedelta(seconds=10),
        second - timedelta(seconds=5),
    )
    # first: its first run is running (a long job), none has finished.
    await run_row(
        store,
        "first",
        now - timedelta(seconds=30),
        state="running",
        lease_owner="worker-a",
        lease_expires_at=now + timedelta(minutes=2),
        started_at=now - timedelta(seconds=29),
    )
    # A run cancelled while it ran: no attempt was recorded.
    ids["cancelled"] = await run_row(
        store,
        "tick",
        now - timedelta(seconds=120),
        state="cancelled",
        claim_epoch=1,
        started_at=now - timedelta(seconds=119),
        finished_at=now - timedelta(seconds=117),
        outcome="cancelled",
        error="cancelled by alice",
    )
    # held: paused an hour ago (the action log says so), one run overdue since.
    await store.pool.execute("UPDATE jobs SET paused = true WHERE name = 'held'")
    await store.pool.execute(
        "INSERT INTO operator_actions (at, actor, via, action, job, ok, result) "
        "VALUES ($1, 'alice', 'cli', 'pause', 'held', true, 'paused')",
        now - timedelta(hours=1),
    )
    await run_row(store, "held", now - timedelta(hours=2))
    return ids


async def json_of(*args: str) -> Any:
    result = await claimd(*args, "--json")
    assert result.code in (0, 1), result
    return json.loads(result.out)


async def test_runs_list_what_happened_and_the_look_ahead_on_request(
    seeded: dict[str, Any],
) -> None:
    db = ("--database-url", seeded["db"])
    listed = [r["id"] for r in (await json_of("runs", "tick", *db))["runs"]]
    assert seeded["ahead"] not in listed
    assert listed[0] == seeded["done"]
    text = await claimd("runs", "tick", *db)
    assert text.out.splitlines()[1].startswith(seeded["done"]), text.out
    ahead = [r["id"] for r in (await json_of("runs", "tick", "--ahead", *db))["runs"]]
    assert ahead[0] == seeded["ahead"]


async def test_jobs_last_outcome_is_not_the_future_and_a_paused_job_is_not_due(
    seeded: dict[str, Any],
) -> None:
    db = ("--database-url", seeded["db"])
    jobs = {j["name"]: j for j in await json_of("jobs", *db)}
    assert jobs["nightly"]["last_outcome"]["run_id"] == seeded["past"]
    assert jobs["nightly"]["last_outcome"]["state"] == "succeeded"
    held = jobs["held"]
    assert (held["next_fire"], held["backlog"], held["oldest_due"]) == (None, 0, None)
    assert jobs["tick"]["schedule"] == "every 5s"
    wide = await claimd("jobs", "--wide", *db)
    rows = {line.split()[0]: line for line in wide.out.splitlines()}
    assert "cancelled" not in rows["nightly"], rows["nightly"]
    assert "every 10m" in rows["held"], rows["held"]
    assert rows["held"].split()[-1] == "paused", rows["held"]
    # next fire (both columns), last outcome, last success, overdue
    assert rows["held"].split()[4:10] == ["-", "-", "never", "ran", "-", "-"], rows["held"]
    # The default table is narrow (six columns, for a terminal), and a pattern filters.
    narrow = (await claimd("jobs", *db)).out.splitlines()
    assert narrow[0].split() == [
        "JOB",
        "SCHEDULE",
        "NEXT",
        "FIRE",
        "LAST",
        "OUTCOME",
        "OVERDUE",
        "STATE",
    ], narrow[0]
    assert max(len(line) for line in narrow) < len(max(wide.out.splitlines(), key=len))
    only = (await claimd("jobs", "nigh", *db)).out.splitlines()
    assert [line.split()[0] for line in only[1:]] == ["nightly"], only
    # The first run of a long job is running, not "never ran".
    first = (await claimd("jobs", "first", *db)).out.splitlines()[1]
    assert "running, none finished yet" in first, first
    globbed = (await claimd("jobs", "t*", *db)).out.splitlines()
    assert [line.split()[0] for line in globbed[1:]] == ["tick"], globbed


async def test_show_lists_every_attempt_with_human_durations_and_escaped_text(
    seeded: dict[str, Any],
) -> None:
    db = ("--database-url", seeded["db"])
    run = await json_of("show", seeded["running"], *db)
    assert [(a["attempt"], a["outcome"]) for a in run["attempts"]] == [
        (1, "failed"),
        (2, "running"),
    ]
    assert run["attempts"][0]["duration_s"] == 5
    shown = await claimd("show", seeded["running"], *db)
    assert shown.code == 0, shown
    assert "\x1b" not in shown.out
    assert "\x07" not in shown.out
    assert "\x9b" not in shown.out
    assert "\r" not in shown.out
    assert "progress \\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x9b31m" in shown.out, shown.out
    lines = shown.out.splitlines()
    assert any(
        line.startswith("outcome:") and "none yet (attempt 1: failed)" in line for line in lines
    ), shown.out
    attempts = [line.split() for line in lines if line[:2] in ("1 ", "2 ")]
    assert attempts[0][:2] == ["1", "1"], attempts
    assert "5s" in attempts[0], attempts
    assert attempts[1][1] == "2", attempts
    assert "running" in attempts[1], attempts
    assert any(cell.startswith("1m") for cell in attempts[1]), attempts  # about 1m 5s so far
    # Durations are "1m 5s", never a timedelta's "0:01:05"; a wall-clock time
    # such as a lease's "23:00:01Z" is not a duration, so it is not matched.
    assert not any(TIMEDELTA_TEXT.search(line) for line in lines), shown.out
    cancelled = await json_of("show", seeded["cancelled"], *db)
    assert [(a["outcome"], a["duration_s"]) for a in cancelled["attempts"]] == [("cancelled", 2)]


async def test_audit_says_paused_pruned_and_not_an_instant(
    seeded: dict[str, Any], store: PostgresRunStore
) -> None:
    db = ("--database-url", seeded["db"])
    now = seeded["now"]
    # Paused: every instant since the pause, none of them missing (exit 0).
    since = (now - timedelta(minutes=50)).isoformat()
    paused = await claimd("audit", "held", "--from", since, "--to", "now", *db)
    assert paused.code == 0, paused
    result = await json_of("audit", "held", "--from", since, "--to", "now", *db)
    assert {e["status"] for e in result["entries"]} == {"paused"}, result["entries"]
    assert len(result["entries"]) >= 4

    # Pruned: retention deletes the 1 January run; the instants up to it are pruned.
    assert await store.prune_history(timedelta(days=30), 100) >= 1
    pruned = await json_of(
        "audit", "nightly", "--from", "2025-12-30", "--to", "2026-01-01 12:00", *db
    )
    assert [e["status"] for e in pruned["entries"]] == ["pruned"] * 3, pruned["entries"]
    assert pruned["summary"]["complete"] is True

    # A time the schedule does not name: not "complete", and the nearest instants.
    odd = await claimd(
        "audit", "nightly", "--from", "2026-01-05 03:00", "--to", "2026-01-05 03:00", *db
    )
    assert odd.code == 1, odd
    line = odd.out.splitlines()[-1]
    assert "is not an instant of the schedule" in line, odd.out
    assert "2026-01-05 02:00:00+01:00" in line, line
    assert "2026-01-06 02:00:00+01:00" in line, line
    assert "complete" not in line, line

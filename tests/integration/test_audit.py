"""`claimd audit` on runs a live replica made: "did every due instant run?" answered.

A clean range is complete (exit 0); a run deleted by hand is reported missing (exit 1);
failures are flagged; instants that `catchup = "none"` dropped after a downtime are
recorded as a gap in the plan's own transaction and reported dropped, with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.domain import IntervalSchedule, take
from actors.replica import Replica
from tests.e2e.helpers import child_env, claimd_command
from tests.integration.helpers import eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAST = {"claim_interval": "50ms", "materialize_interval": "200ms", "shutdown_grace": "5s"}


async def claimd(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *claimd_command(),
        *args,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def count(store: PostgresRunStore, job: str, state: str) -> int:
    return int(
        await store.pool.fetchval(
            "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = $1 AND r.state = $2",
            job,
            state,
        )
    )


async def settled_prefix(
    store: PostgresRunStore, job: str, state: str
) -> tuple[datetime, list[str], list[datetime]]:
    """Since the job was created: the run ids and instants, up to the first not in ``state``."""
    created = await store.pool.fetchval("SELECT created_at FROM jobs WHERE name = $1", job)
    rows = await store.pool.fetch(
        "SELECT r.id::text AS id, r.scheduled_at, r.state FROM job_runs r JOIN jobs j "
        "ON j.id = r.job_id WHERE j.name = $1 ORDER BY r.scheduled_at",
        job,
    )
    ids: list[str] = []
    instants: list[datetime] = []
    for row in rows:
        if row["state"] != state:
            break
        ids.append(row["id"])
        instants.append(row["scheduled_at"])
    return created, ids, instants


async def test_a_clean_range_is_complete_and_a_run_deleted_by_hand_is_missing(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    schema_url: str,
    tmp_path: Path,
) -> None:
    loaded = make_config(
        """
        [jobs.tick]
        every = "1s"
        run = { python = "actors.config.examples:hello" }

        [jobs.broken]
        every = "1s"
        max_attempts = 1
        run = { shell = ["/bin/sh", "-c", "echo no disk >&2; exit 3"] }
    """,
        **FAST,
    )
    async with running(Replica(tmp_path / "claimd.toml", loaded)):

        async def enough() -> bool:
            return (
                await count(store, "tick", "succeeded") >= 6
                and await count(store, "broken", "failed") >= 3
            )

        await eventually(enough, timeout=40, what="runs of tick and broken")
    db = ["--database-url", schema_url]

    # From the job's creation (its first plan starts there: no instant before the
    # first tick is lost) to the last of the runs that all succeeded.
    created, ids, instants = await settled_prefix(store, "tick", "succeeded")
    assert len(instants) >= 4
    assert instants[0] - created <= timedelta(seconds=1)
    window = ["--from", created.isoformat(), "--to", instants[-1].isoformat()]
    code, out, err = await claimd("audit", "tick", *window, *db, "--json")
    assert code == 0, err
    audit = json.loads(out)
    assert [e["status"] for e in audit["entries"]] == ["succeeded"] * len(instants)
    assert audit["summary"]["complete"] is True
    assert audit["summary"]["due"] == len(instants)
    code, out, _ = await claimd("audit", "tick", *window, *db)
    assert code == 0
    assert out.strip().splitlines()[-1].endswith("-- complete")

    # An operator (or a bug) deletes one run: the audit names the instant and fails.
    hole = instants[len(instants) // 2]
    await store.pool.execute("DELETE FROM job_runs WHERE id = $1::uuid", ids[len(ids) // 2])
    code, out, _ = await claimd("audit", "tick", *window, *db)
    assert code == 1, out
    flagged = [line for line in out.splitlines() if line.startswith("!")]
    assert len(flagged) == 1
    assert "missing" in flagged[0]
    assert hole.strftime("%Y-%m-%d %H:%M:%S") in flagged[0]
    assert out.strip().splitlines()[-1].endswith("1 missing -- INCOMPLETE")

    # A job that always fails is not a job that never ran.
    created, failed_ids, failed = await settled_prefix(store, "broken", "failed")
    code, out, _ = await claimd(
        "audit",
        "broken",
        "--from",
        created.isoformat(),
        "--to",
        failed[-1].isoformat(),
        *db,
        "--json",
    )
    assert code == 1
    assert json.loads(out)["summary"]["counts"]["failed"] == len(failed)
    code, out, _ = await claimd("jobs", *db, "--json")
    jobs = {j["name"]: j for j in json.loads(out)}
    assert jobs["broken"]["last_outcome"]["state"] == "failed"
    assert jobs["broken"]["last_success"] is None
    assert jobs["tick"]["last_success"] is not None
    code, out, _ = await claimd("show", failed_ids[0], *db)
    assert code == 0
    assert "failed" in out
    assert "no disk" in out  # the output tail


async def test_instants_dropped_by_catchup_none_after_a_downtime_are_reported_dropped(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    schema_url: str,
    tmp_path: Path,
) -> None:
    loaded = make_config(
        """
        [jobs.sparse]
        every = "10s"
        catchup = "none"
        run = { python = "actors.config.examples:hello" }
    """,
        **FAST,
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    # What a downtime leaves in the database: the job was planned and ran until the
    # scheduler stopped five minutes ago, and nothing has been written since.
    now: datetime = await store.pool.fetchval("SELECT now()")
    born, stopped = now - timedelta(minutes=10), now - timedelta(minutes=5)
    job_id = await store.pool.fetchval(
        "UPDATE jobs SET created_at = $1, materialized_until = $2 WHERE name = 'sparse' "
        "RETURNING id",
        born,
        stopped,
    )
    before = take(IntervalSchedule(timedelta(seconds=10)).fire_times(born, stopped))
    await store.pool.execute(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, finished_at) "
        "SELECT $1, t, t, 'succeeded', 'succeeded', t FROM unnest($2::timestamptz[]) t",
        job_id,
        before,
    )
    restarted: datetime = await store.pool.fetchval("SELECT now()")

    async with running(Replica(tmp_path / "claimd.toml", loaded)):

        async def back() -> bool:
            return await count(store, "sparse", "succeeded") > len(before)

        await eventually(back, timeout=40, what="a run after the restart")

    # Up to just before the restart (later instants may be late, not missed).
    end = restarted - timedelta(seconds=10)
    window = ["--from", born.isoformat(), "--to", end.isoformat(), "--database-url", schema_url]
    code, out, err = await claimd("audit", "sparse", *window, "--json")
    assert code == 0, err
    audit = json.loads(out)
    ran = [e for e in audit["entries"] if e["scheduled_at"] <= stopped.isoformat()]
    gone = [e for e in audit["entries"] if e["scheduled_at"] > stopped.isoformat()]
    assert {e["status"] for e in ran} == {"succeeded"}
    assert len(ran) == len(before)
    assert len(gone) >= 25  # five minutes of a job every 10 s, less the last few seconds
    assert {(e["status"], e["reason"]) for e in gone} == {
        ("dropped", "missed while no scheduler ran (catchup = none)")
    }
    assert audit["summary"]["complete"] is True
    code, out, _ = await claimd("audit", "sparse", *window)
    assert code == 0
    assert "dropped" in out
    assert "missed while no scheduler ran (catchup = none)" in out
    gap = await store.pool.fetchrow("SELECT * FROM job_run_gaps WHERE job_id = $1", job_id)
    dropped = take(IntervalSchedule(timedelta(seconds=10)).fire_times(stopped, gap["to_at"]))
    assert (gap["from_at"], gap["count"]) == (dropped[0], len(dropped))

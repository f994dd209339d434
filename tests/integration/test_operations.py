"""Operator actions on the real servers: pause/resume, trigger, backfill, cancel, reload,
and history retention (pruning) with the claim's plan on its partial index.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest
from structlog.testing import capture_logs

from actors.adapters.postgres import (
    CLAIM_DUE_RUNS,
    BackfillProgress,
    BackfillTooLarge,
    Operations,
    PostgresRunStore,
    UnknownJob,
)
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import RARE_CRON, counter, eventually, running
from tests.integration.semantics_jobs import executed_run_ids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = {
    "claim_interval": "50ms",
    "materialize_interval": "200ms",
    "reap_interval": "200ms",
    "shutdown_grace": "3s",
}
# A short lease so that a heartbeat (every min(lease/4, ack_wait/2)) comes quickly.
SHORT_LEASE = {"lease": "6s", "ack_wait": "1s", "max_deliver": 2}
RECORD = "tests.integration.semantics_jobs:record"


async def _synced(store: PostgresRunStore, loaded: LoadedConfig) -> Replica:
    """The jobs written first (so the test can act on them at once), and a replica for them."""
    await store.sync_jobs(list(loaded.jobs.values()))
    return Replica(Path(loaded.path), loaded)


async def _run(store: PostgresRunStore, run_id: str) -> asyncpg.Record:
    row = await store.pool.fetchrow(
        "SELECT id::text AS id, state, attempt, outcome, error, trigger, scheduled_at, "
        "started_at, finished_at, claim_epoch FROM job_runs WHERE id = $1::uuid",
        run_id,
    )
    assert row is not None
    return row


async def _count(store: PostgresRunStore, job: str, where: str = "true", *args: Any) -> int:
    return int(
        await store.pool.fetchval(
            "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            f"WHERE j.name = $1 AND {where}",
            job,
            *args,
        )
    )


async def _db_now(store: PostgresRunStore) -> datetime:
    now: datetime = await store.pool.fetchval("SELECT clock_timestamp()")
    return now


async def _wait_state(
    store: PostgresRunStore, run_id: str, states: set[str], timeout: float = 30.0
) -> None:
    async def reached() -> bool:
        return (
            await store.pool.fetchval("SELECT state FROM job_runs WHERE id = $1::uuid", run_id)
            in states
        )

    await eventually(reached, timeout=timeout, what=f"run {run_id} in {states}")


async def _stays(check: Callable[[], Any], seconds: float) -> None:
    """Assert ``check`` holds at every poll for ``seconds`` (an absence, observed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert await check(), f"no longer true after {seconds - (deadline - time.monotonic()):.2f}s"
        await asyncio.sleep(0.05)


# --- pause and resume ---------------------------------------------------------------------


async def test_pause_stops_new_runs_within_a_tick_and_resume_restarts_them(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        f"""
        [jobs.ticker]
        every = "1s"
        run = {{ python = "{RECORD}" }}
    """,
        **FAST,
    )
    ops = Operations(store.pool)
    async with running(await _synced(store, loaded)):

        async def two_done() -> bool:
            return await _count(store, "ticker", "r.state = 'succeeded'") >= 2

        await eventually(two_done, what="two runs before the pause")
        await ops.pause("ticker")
        # "Within one tick": a materializer tick (200ms) or claim (50ms) that read the
        # job before the pause committed may still land; give that one tick room.
        await asyncio.sleep(1.0)

        # What was claimed before the pause may still finish; nothing else may follow.
        async def nothing_active() -> bool:
            return await _count(store, "ticker", "r.state IN ('claimed', 'running')") == 0

        await eventually(nothing_active, timeout=10, what="in-flight runs to end after pause")
        quiet_since = await _db_now(store)
        rows_at_pause = await _count(store, "ticker")

        async def still_paused() -> bool:
            started = await _count(
                store,
                "ticker",
                "(r.started_at > $2 OR r.state IN ('claimed', 'running'))",
                quiet_since,
            )
            # Paused jobs materialize nothing either (the horizon would add a row a second).
            rows = await _count(store, "ticker")
            assert (started, rows) == (0, rows_at_pause)
            return True

        await _stays(still_paused, 2.5)
        waiting = await _count(store, "ticker", "r.state = 'pending' AND r.due_at <= now()")
        assert waiting >= 2, "the pause must have held back runs that were due"

        await ops.resume("ticker")
        resumed_at = await _db_now(store)

        async def runs_again() -> bool:
            return (
                await _count(
                    store, "ticker", "r.state = 'succeeded' AND r.started_at > $2", resumed_at
                )
                >= 2
            )

        await eventually(runs_again, what="runs after resume")
    with pytest.raises(UnknownJob):
        await ops.pause("no-such-job")


# --- trigger ------------------------------------------------------------------------------


async def test_trigger_runs_now_once_per_instant(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        f"""
        [jobs.manual]
        cron = "{RARE_CRON}"
        run = {{ python = "{RECORD}" }}
    """,
        **FAST,
    )
    ops = Operations(store.pool)
    async with running(await _synced(store, loaded)):
        at = datetime.now(UTC)
        run_id = await ops.trigger("manual", at)
        assert run_id is not None
        await _wait_state(store, run_id, {"succeeded"})
        # The same instant again: still one row, nothing runs again.
        assert await ops.trigger("manual", at) is None
        other = await ops.trigger("manual", at + timedelta(milliseconds=1))
        assert other is not None
        await _wait_state(store, other, {"succeeded"})
    row = await _run(store, run_id)
    assert (row["trigger"], row["scheduled_at"], row["attempt"]) == ("manual", at, 1)
    assert await _count(store, "manual") == 2
    ran = [e for e in executed_run_ids("manual") if e in (run_id, other)]
    assert sorted(ran) == sorted([run_id, other])
    with pytest.raises(UnknownJob):
        await ops.trigger("no-such-job", at)


# --- backfill -----------------------------------------------------------------------------


async def test_backfill_creates_exactly_the_missing_instants_and_they_run(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        f"""
        [jobs.every-ten]
        cron = "*/10 * * * *"
        run = {{ python = "{RECORD}" }}
    """,
        **FAST,
    )
    ops = Operations(store.pool)
    now = datetime.now(UTC)
    # A range two to three hours back: older than the job's start deadline (1 h), so
    # a backfilled run must still run, not be skipped as late.
    start = (now - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=1)
    instants = [start + timedelta(minutes=10 * i) for i in range(7)]
    replica = await _synced(store, loaded)
    # One instant of the range already has a row.
    existing = await ops.trigger("every-ten", instants[2])
    assert existing is not None
    done = await ops.backfill("every-ten", start, end)
    assert (done.instants, done.added, done.existing) == (7, 6, 1)
    assert (await ops.backfill("every-ten", start, end)).added == 0
    rows = await store.pool.fetch(
        "SELECT id::text AS id, scheduled_at, trigger FROM job_runs "
        "WHERE scheduled_at BETWEEN $1 AND $2 ORDER BY scheduled_at",
        start - timedelta(minutes=30),
        end + timedelta(minutes=30),
    )
    assert [r["scheduled_at"] for r in rows] == instants
    assert [r["trigger"] for r in rows] == ["backfill"] * 2 + ["manual"] + ["backfill"] * 4

    in_range = "r.scheduled_at BETWEEN $2 AND $3"
    async with running(replica):

        async def all_ended() -> bool:
            return (
                await _count(
                    store,
                    "every-ten",
                    f"{in_range} AND r.state IN ('succeeded', 'failed', 'skipped', 'cancelled')",
                    start,
                    end,
                )
                == 7
            )

        await eventually(all_ended, what="the backfilled runs to end")
    assert (
        await _count(store, "every-ten", f"{in_range} AND r.state = 'succeeded'", start, end) == 7
    )
    assert {r["id"] for r in rows} <= executed_run_ids("every-ten")
    assert (await ops.backfill("every-ten", start, end)).added == 0


async def test_backfill_writes_a_long_range_chunk_by_chunk_and_refuses_past_its_limit(
    store: PostgresRunStore, make_config: Callable[..., LoadedConfig]
) -> None:
    loaded = make_config(f"""
        [jobs.minutely]
        cron = "* * * * *"
        run = {{ python = "{RECORD}" }}
    """)
    await store.sync_jobs(list(loaded.jobs.values()))
    ops = Operations(store.pool)
    start = datetime(2021, 6, 1, tzinfo=UTC)
    end = start + timedelta(minutes=99)  # 100 instants
    await ops.trigger("minutely", start + timedelta(minutes=50))
    seen: list[BackfillProgress] = []
    done = await ops.backfill("minutely", start, end, chunk=30, progress=seen.append)
    assert [(p.covered, p.added, p.through) for p in seen] == [
        (30, 30, start + timedelta(minutes=29)),
        (60, 59, start + timedelta(minutes=59)),
        (90, 89, start + timedelta(minutes=89)),
        (100, 99, end),
    ]
    assert (done.instants, done.added, done.existing) == (100, 99, 1)
    assert await _count(store, "minutely") == 100

    # A cron schedule is counted by walking it, up to the limit: "more than".
    with pytest.raises(BackfillTooLarge, match="covers more than 99 instants") as refused:
        await ops.backfill("minutely", start, end + timedelta(days=365), max_runs=99)
    assert (refused.value.exact, refused.value.limit) == (False, 99)
    assert await _count(store, "minutely") == 100
    exact = await ops.backfill("minutely", start, end, max_runs=100)
    assert (exact.instants, exact.added) == (100, 0)


# --- cancel -------------------------------------------------------------------------------


async def test_cancel_pending_run_is_never_executed(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(
        f"""
        [jobs.cancellable]
        cron = "{RARE_CRON}"
        run = {{ python = "{RECORD}" }}
    """,
        **FAST,
    )
    ops = Operations(store.pool)
    replica = await _synced(store, loaded)
    now = datetime.now(UTC)
    doomed = await ops.trigger("cancellable", now - timedelta(seconds=2))
    assert doomed is not None
    assert await ops.cancel(doomed) is True
    assert await ops.cancel(doomed) is False  # already terminal
    async with running(replica):
        # A later run of the same job: once it is done, the cancelled one (due earlier)
        # would have been claimed first had it still been pending.
        sentinel = await ops.trigger("cancellable", now)
        assert sentinel is not None
        await _wait_state(store, sentinel, {"succeeded"})
    row = await _run(store, doomed)
    assert (row["state"], row["outcome"], row["claim_epoch"]) == ("cancelled", "cancelled", 0)
    assert row["started_at"] is None
    assert doomed not in executed_run_ids("cancellable")
    assert sentinel in executed_run_ids("cancellable")


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_cancel_running_run_kills_the_execution_and_stays_cancelled(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    script = f"sleep 60 & echo $! > {tmp_path}/child.pid; echo $$ > {tmp_path}/parent.pid; wait"
    loaded = make_config(
        f"""
        [jobs.long-shell]
        cron = "{RARE_CRON}"
        timeout = "2m"
        run = {{ shell = "{script}", use_shell = true }}
    """,
        **FAST,
        **SHORT_LEASE,
    )
    ops = Operations(store.pool)
    lost_before = counter("claimd_leases_lost_total")
    procs: list[psutil.Process] = []
    try:
        async with running(await _synced(store, loaded)):
            run_id = await ops.trigger("long-shell", datetime.now(UTC))
            assert run_id is not None

            async def started() -> bool:
                return all(_pid_in(tmp_path / f) for f in ("parent.pid", "child.pid"))

            await eventually(started, what="the shell job to start")
            procs = [psutil.Process(_pid_in(tmp_path / f)) for f in ("parent.pid", "child.pid")]
            assert (await _run(store, run_id))["state"] == "running"
            assert await ops.cancel(run_id, "operator says stop") is True
            cancelled = await _run(store, run_id)

            async def killed() -> bool:
                return all(_gone(p) for p in procs)

            # The next heartbeat is refused; the worker cancels and kills the group.
            await eventually(killed, timeout=30, what="the cancelled job's processes to end")

            async def lease_lost_noticed() -> bool:
                return counter("claimd_leases_lost_total") > lost_before

            await eventually(lease_lost_noticed, what="the worker to notice the lost lease")
        row = await _run(store, run_id)
        assert (row["state"], row["outcome"], row["error"]) == (
            "cancelled",
            "cancelled",
            "operator says stop",
        )
        assert row["finished_at"] == cancelled["finished_at"]
        attempts = await store.pool.fetchval(
            "SELECT count(*) FROM job_run_attempts WHERE run_id = $1::uuid", run_id
        )
        assert attempts == 0  # the killed execution recorded nothing over the cancel
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()


# --- reload -------------------------------------------------------------------------------


def _job(name: str, schedule: str) -> str:
    return f'[jobs.{name}]\n{schedule}\nrun = {{ python = "{RECORD}" }}\n\n'


async def _jobs_table(store: PostgresRunStore) -> list[tuple[Any, ...]]:
    rows = await store.pool.fetch(
        "SELECT name, enabled, paused, fingerprint, updated_at, materialized_until IS NULL "
        "FROM jobs ORDER BY name"
    )
    return [tuple(r) for r in rows]


async def test_reload_adds_changes_and_removes_jobs_and_rejects_a_broken_file(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    settings = {**FAST, "horizon": "1m"}
    loaded = make_config(
        _job("a", 'every = "1s"') + _job("b", 'every = "7s"') + _job("c", 'every = "1s"'),
        **settings,
    )
    replica = await _synced(store, loaded)
    async with running(replica):

        async def warmed_up() -> bool:
            return (
                await _count(store, "a", "r.state = 'succeeded'") >= 1
                and await _count(store, "c", "r.state = 'succeeded'") >= 1
                and await _count(store, "b", "r.state = 'pending'") >= 5
            )

        await eventually(warmed_up, what="a, b and c to be running")
        a_before = [r for r in await _jobs_table(store) if r[0] == "a"]
        b_old_future = await _count(store, "b", "r.state = 'pending' AND r.scheduled_at > now()")
        assert b_old_future >= 5
        c_history = await _count(store, "c", "r.state = 'succeeded'")

        # A unchanged, B every 5 s instead of 7 s, C removed, D added; reloaded by SIGHUP.
        make_config(
            _job("a", 'every = "1s"') + _job("b", 'every = "5s"') + _job("d", 'every = "1s"'),
            **settings,
        )
        os.kill(os.getpid(), signal.SIGHUP)

        async def reloaded() -> bool:
            return "d" in replica.jobs and "c" not in replica.jobs

        await eventually(reloaded, what="the replica to reload on SIGHUP")
        reloaded_at = await _db_now(store)

        async def d_runs() -> bool:
            return await _count(store, "d", "r.state = 'succeeded'") >= 1

        await eventually(d_runs, what="the added job to run")

        async def b_rematerialized() -> bool:
            return await _count(store, "b", "r.scheduled_at > $2", reloaded_at) >= 8

        await eventually(b_rematerialized, what="b's new schedule to be materialized")
        b_future = await store.pool.fetch(
            "SELECT r.scheduled_at FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = 'b' AND r.scheduled_at > $1",
            reloaded_at,
        )
        off_grid = [
            r["scheduled_at"] for r in b_future if int(r["scheduled_at"].timestamp()) % 5 != 0
        ]
        assert off_grid == [], "old-schedule future runs of b were not withdrawn"

        c_row = await store.pool.fetchrow("SELECT enabled FROM jobs WHERE name = 'c'")
        assert c_row["enabled"] is False
        assert await _count(store, "c", "r.state = 'pending'") == 0
        assert (
            await _count(
                store, "c", "r.state = 'cancelled' AND r.error = $2", "job removed from config"
            )
            >= 1
        )
        assert await _count(store, "c", "r.state = 'succeeded'") >= c_history  # history kept
        assert [r for r in await _jobs_table(store) if r[0] == "a"] == a_before

        # A file with one broken job is refused as a whole; the running set stays.
        before = await _jobs_table(store)
        jobs_before = dict(replica.jobs)
        make_config(
            _job("a", 'every = "1s"')
            + _job("b", 'cron = "61 * * * *"')
            + _job("d", 'every = "1s"')
            + _job("e", 'every = "1s"'),
            **settings,
        )
        with capture_logs() as logs:
            assert await replica.reload(store) is False
        assert await _jobs_table(store) == before
        assert replica.jobs == jobs_before
        rejected = [e for e in logs if e["event"] == "reload rejected; running jobs unchanged"]
        assert len(rejected) == 1
        assert "job 'b'" in rejected[0]["errors"]
        assert "field 'cron'" in rejected[0]["errors"]
        d_done = await _count(store, "d", "r.state = 'succeeded'")

        async def d_still_runs() -> bool:
            return await _count(store, "d", "r.state = 'succeeded'") > d_done

        await eventually(d_still_runs, what="the running set to go on after a refused reload")
    assert await _count(store, "e") == 0


async def test_a_job_removed_and_added_back_runs_every_instant_due_after_it_is_back(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    """Removed then re-added by reload: the instants ahead are planned again, not cancelled.

    The removal cancels the rows made ahead (up to the horizon) as "job removed
    from config"; the re-add must take those of instants still ahead back, or
    the job skips a horizon of its runs while it is in the config (issue 18).
    """
    settings = {**FAST, "horizon": "1m"}
    both = _job("back", 'every = "1s"') + _job("other", 'every = "1s"')
    loaded = make_config(both, **settings)
    replica = await _synced(store, loaded)
    async with running(replica):

        async def planned_ahead() -> bool:
            return await _count(store, "back", "r.scheduled_at > now() + interval '30 seconds'") > 0

        await eventually(planned_ahead, what="back's runs planned a horizon ahead")
        # An operator's cancel of an instant ahead is a decision, not the removal's: it stays.
        kept_off = await store.pool.fetchval(
            "SELECT r.id::text FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE j.name = "
            "'back' AND r.scheduled_at > now() + interval '20 seconds' ORDER BY r.scheduled_at "
            "LIMIT 1"
        )
        assert await Operations(store.pool).cancel(kept_off, "cancelled by alice")
        make_config(_job("other", 'every = "1s"'), **settings)
        assert await replica.reload(store) is True
        removed_why = "job removed from config"
        removed = "r.state = 'cancelled' AND r.error = $2 AND r.scheduled_at > now()"
        assert await _count(store, "back", removed, removed_why) > 0
        make_config(both, **settings)
        # Back to a file already superseded: an operator's rollback (docs/rollout.md).
        assert await replica.reload(store, force=True) is True
        back_at = await _db_now(store)

        # Nothing the removal cancelled of an instant after the re-add stays so,
        # and the materializer plans the whole horizon again.
        after = "r.scheduled_at > $2 AND r.scheduled_at <= $2 + interval '30 seconds'"
        assert await _count(store, "back", f"{after} AND r.error = $3", back_at, removed_why) == 0

        async def horizon_planned_again() -> bool:
            return await _count(store, "back", after, back_at) == 30

        await eventually(horizon_planned_again, what="back's next 30 instants planned again")

        # And they run: each of the first three instants after the re-add succeeds.
        first = "r.scheduled_at > $2 AND r.scheduled_at <= $2 + interval '3 seconds'"

        async def ran_after_the_re_add() -> bool:
            return await _count(store, "back", f"{first} AND r.state = 'succeeded'", back_at) == 3

        await eventually(ran_after_the_re_add, what="back's instants after the re-add to run")
        cancelled = await store.pool.fetch(
            "SELECT r.id::text AS id, r.error FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = 'back' AND r.state = 'cancelled' AND r.scheduled_at > $1",
            back_at,
        )
        assert [tuple(r) for r in cancelled] == [(kept_off, "cancelled by alice")]


# --- retention ----------------------------------------------------------------------------


def _index_names(plan: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= _index_names(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _index_names(value)
    return found


async def _claim_plan(store: PostgresRunStore) -> Any:
    async with store.pool.acquire() as conn:
        await conn.execute("ANALYZE job_runs")
        text = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + CLAIM_DUE_RUNS,
            "explain",
            500,
            timedelta(minutes=2),
            timedelta(0),
        )
    return json.loads(text)


async def test_pruning_200k_old_runs_keeps_recent_history_and_the_claim_on_its_index(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore
) -> None:
    loaded = make_config(f"""
        [jobs.busy]
        cron = "{RARE_CRON}"
        run = {{ python = "{RECORD}" }}
    """)
    await store.sync_jobs(list(loaded.jobs.values()))
    job_id = await store.pool.fetchval("SELECT id FROM jobs WHERE name = 'busy'")
    old = 200_000
    await store.pool.execute(
        """INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, started_at,
                                 finished_at)
           SELECT $1, t, t, s, s, t, t + interval '1 second'
             FROM generate_series(1, $2::int) g,
                  LATERAL (SELECT timestamptz '2020-01-01' + g * interval '1 minute') AS i(t),
                  LATERAL (SELECT (ARRAY['succeeded', 'failed', 'skipped', 'cancelled'])
                                  [1 + g % 4]) AS k(s)""",
        job_id,
        old,
    )
    recent_ids = {
        r["id"]
        for r in await store.pool.fetch(
            """INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, started_at,
                                 finished_at)
           SELECT $1, t, t, 'succeeded', 'succeeded', t, t + interval '1 second'
             FROM generate_series(1, 5000) g,
                  LATERAL (SELECT now() - interval '2 days' + g * interval '1 second') AS i(t)
           RETURNING id::text""",
            job_id,
        )
    }
    pending_ids = {
        r["id"]
        for r in await store.pool.fetch(
            """INSERT INTO job_runs (job_id, scheduled_at, due_at)
           SELECT $1, t, t FROM generate_series(1, 200) g,
                  LATERAL (SELECT now() - interval '10 seconds' + g * interval '1 second')
                          AS i(t)
           RETURNING id::text""",
            job_id,
        )
    }

    plan = await _claim_plan(store)
    assert "job_runs_pending_due" in _index_names(plan), json.dumps(plan, indent=1)

    pruned = 0
    ops = Operations(store.pool)
    for _ in range(100):
        n = await ops.prune(timedelta(days=30), batch=10_000)
        pruned += n
        if n == 0:
            break
    assert pruned == old
    left = {
        r["id"]: r["state"]
        for r in await store.pool.fetch("SELECT id::text AS id, state FROM job_runs")
    }
    assert set(left) == recent_ids | pending_ids
    assert {left[i] for i in pending_ids} == {"pending"}
    assert {left[i] for i in recent_ids} == {"succeeded"}
    assert await ops.prune(timedelta(days=30)) == 0

    plan = await _claim_plan(store)
    assert "job_runs_pending_due" in _index_names(plan), json.dumps(plan, indent=1)

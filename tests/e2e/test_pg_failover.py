"""A PostgreSQL failover under two running replicas: the primary stopped, the standby promoted.

A primary and a synchronous streaming standby (initdb + pg_basebackup -R with
the machine's PostgreSQL binaries, on loopback), two `claimd run` replicas on
the multi-host URL ``postgresql://h1,h2/db?target_session_attrs=read-write``,
jobs every second. Mid-run the primary is stopped (``-m immediate``: no clean
shutdown) and the standby promoted; the replicas find the new primary by
themselves. Judged in SQL on the new primary: every due instant of the window
(which spans the failover) is one succeeded row, executed once.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.helpers import (
    ClaimdProcess,
    check_effectively_once,
    effect_job,
    eventually,
    read_effects,
    utcnow,
    write_config,
)
from tests.servers import PostgresPair, postgres_bindir

pytestmark = [pytest.mark.failover, pytest.mark.e2e, pytest.mark.timeout(240)]

JOBS = ("f1", "f2", "f3")
BEFORE_S = 8.0  # runs before the failover
AFTER_S = 12.0  # runs after it (two leases)
GRACE_S = 10
LEASE_S = 6


@pytest.fixture
def pair() -> Iterator[PostgresPair]:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) found; "
            "install postgresql or set CLAIMD_TEST_PG_BINDIR"
        )
    # Not under tmp_path: the server runs as an unprivileged user when we are root,
    # and pytest's base temp dir is private to us.
    servers = PostgresPair(Path(tempfile.mkdtemp(prefix="claimd-failover-")), bindir).start()
    yield servers
    servers.stop()


async def fetch(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def first_start_after(url: str, instant: datetime) -> datetime | None:
    rows = await fetch(
        url, "SELECT min(started_at) AS first FROM job_runs WHERE started_at > $1", instant
    )
    first: datetime | None = rows[0]["first"]
    return first


async def test_primary_stopped_and_standby_promoted_mid_run_loses_and_doubles_nothing(
    pair: PostgresPair, nats_url: str, deployment: str, tmp_path: Path
) -> None:
    async def synchronous() -> bool:
        rows = await fetch(
            pair.url(pair.primary_port), "SELECT sync_state FROM pg_stat_replication"
        )
        return [r["sync_state"] for r in rows] == ["sync"]

    # A standby catching up after its start is reported async until it has caught up.
    await eventually(synchronous, timeout=60, what="the standby to stream synchronously")
    effects = tmp_path / "effects.txt"
    config = write_config(
        tmp_path / "claimd.toml",
        jobs="".join(effect_job(j, effects) for j in JOBS),
        database_url=pair.multi_host_url,
        nats_url=nats_url,
        deployment=deployment,
        http="off",
        shutdown_grace=f"{GRACE_S}s",
        lease=f"{LEASE_S}s",
        ack_wait="1s",
        max_deliver=2,
        claim_interval="100ms",
        materialize_interval="500ms",
    )
    replicas = [
        ClaimdProcess(["run", "--config", str(config)], tmp_path, f"replica{i}").start()
        for i in range(2)
    ]
    new_primary = pair.url(pair.standby_port)
    try:

        def alive() -> None:
            for r in replicas:
                assert r.returncode() is None, f"{r.label} exited:\n{r.stderr()[-3000:]}"

        async def executing() -> bool:
            alive()
            return bool(read_effects(effects))

        await eventually(executing, timeout=60, what="the first execution")
        await asyncio.sleep(BEFORE_S)  # a run length, not an ordering
        stopped_at = utcnow()
        pair.stop_primary_immediately()
        pair.promote_standby()
        promoted_s = (utcnow() - stopped_at).total_seconds()

        async def started_again() -> bool:
            alive()
            return await first_start_after(new_primary, stopped_at) is not None

        await eventually(started_again, timeout=60, what="a run started on the new primary")
        first_start = await first_start_after(new_primary, stopped_at)
        assert first_start is not None
        clock = time.monotonic()
        while time.monotonic() - clock < AFTER_S:
            alive()
            await asyncio.sleep(0.2)
        for r in replicas:
            r.terminate()
        for r in replicas:
            code = await r.wait(GRACE_S + 15)
            assert code == 0, f"{r.label} exited {code}:\n{r.stderr()[-3000:]}"
    finally:
        for r in replicas:
            r.kill()

    all_effects = read_effects(effects)
    figures = [await check_effectively_once(new_primary, job, all_effects) for job in JOBS]
    for f in figures:
        assert f.first < stopped_at < f.last, (
            f"{f.job}: the checked window {f.first}..{f.last} does not span the failover"
        )
    recovery_s = (first_start - stopped_at).total_seconds()
    lags = await fetch(
        new_primary,
        "SELECT extract(epoch FROM started_at - due_at)::float8 AS lag "
        "FROM job_runs WHERE due_at BETWEEN $1 AND $1 + $2::interval",
        stopped_at,
        timedelta(seconds=2 * LEASE_S),
    )
    worst = max(r["lag"] for r in lags)
    lost_events = sum(len(r.events("postgres unreachable")) for r in replicas)
    back_events = sum(len(r.events("postgres reachable again")) for r in replicas)
    runs = sum(f.succeeded for f in figures)
    print(
        f"\nPostgreSQL failover (synchronous standby promoted, lease {LEASE_S}s):"
        f"\n  runs due in window {runs}, succeeded {runs}, lost 0, doubled 0, "
        f"duplicate executions {sum(f.duplicate_executions for f in figures)}"
        f"\n  recovery: first run started {recovery_s:.2f}s after the primary stopped "
        f"(promotion took {promoted_s:.2f}s); worst start lag of the runs "
        f"due in the two leases after the stop {worst:.2f}s"
        f"\n  replicas logged 'postgres unreachable' {lost_events}x, "
        f"'postgres reachable again' {back_events}x"
    )
    assert back_events >= 1, "no replica said it reached the database again"

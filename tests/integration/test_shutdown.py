"""Stopping and losing the stream: bounded, clean, nothing left stuck."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica, stop_bound
from tests.chaos.harness import database_upstream, via_proxy_database
from tests.chaos.proxy import FaultProxy, Mode
from tests.integration.helpers import Replicas, eventually

pytestmark = pytest.mark.integration


async def test_sigterm_with_a_sync_job_past_the_grace_exits_and_hands_the_run_back(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    make_config(
        """
        [jobs.stuck]
        every = "1h"
        run = { python = "tests.integration.slow_jobs:sleep_sync" }
    """,
        shutdown_grace="1s",
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    config = tmp_path / "claimd.toml"
    replicas = Replicas(tmp_path)
    try:
        proc = await replicas.start(config, "r1")

        async def job_known() -> bool:
            return bool(await store.pool.fetchval("SELECT count(*) FROM jobs"))

        await eventually(job_known)
        await store.pool.execute(
            "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) "
            "SELECT id, now(), now(), 'manual' FROM jobs"
        )

        async def running() -> bool:
            return (
                await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'running'")
                == 1
            )

        await eventually(running)
        proc.send_signal(signal.SIGTERM)
        # A thread of the default executor would keep the process alive for the
        # whole 120 s sleep; grace + margin is the most a stop may take.
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await replicas.stop_all()
    row = await store.pool.fetchrow("SELECT state, attempt FROM job_runs WHERE trigger = 'manual'")
    # Handed back at once, its attempt number not used up.
    assert (row["state"], row["attempt"]) == ("pending", 1)
    outcomes = [
        r["outcome"] for r in await store.pool.fetch("SELECT outcome FROM job_run_attempts")
    ]
    assert outcomes == ["interrupted"]


async def test_sigterm_ends_a_replica_whose_database_connection_went_silent(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    schema_url: str,
    tmp_path: Path,
) -> None:
    # Regression: the database link is blackholed (bytes dropped, no reset),
    # as a NAT table expiry does. Every call in flight hangs; the forced stop
    # used to await the pool's close without a bound, and the process never
    # ended. It must end within its bound however the network behaves.
    make_config(
        """
        [jobs.beat]
        every = "1s"
        run = { python = "tests.integration.semantics_jobs:record" }
    """,
        shutdown_grace="1s",
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    proxy = await FaultProxy("db", database_upstream(schema_url)).start()
    replicas = Replicas(tmp_path)
    try:
        proc = await replicas.start(
            tmp_path / "claimd.toml",
            "r1",
            CLAIMD_DATABASE_URL=via_proxy_database(schema_url, proxy.port),
        )

        async def runs_succeed() -> bool:
            return bool(
                await store.pool.fetchval(
                    "SELECT count(*) >= 2 FROM job_runs WHERE state = 'succeeded'"
                )
            )

        await eventually(runs_succeed)
        proxy.set_mode(Mode.BLACKHOLE)
        assert proxy.stats.caught >= 1  # the replica's pooled connections, now silent
        proc.send_signal(signal.SIGTERM)
        # Not a timing assertion: a safety deadline past the bound, so that a
        # replica that never ends fails the test instead of hanging it.
        code = await asyncio.wait_for(proc.wait(), stop_bound(1.0) + 15)
        assert code in (0, 1)  # 1: the stop was forced (the leases recover the runs)
    finally:
        await replicas.stop_all()
        await proxy.close()


async def test_dispatch_recovers_when_the_stream_is_deleted_under_it(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    from actors.adapters.nats import JetStreamBroker

    loaded = make_config(
        """
        [jobs.tick]
        every = "1s"
        run = { python = "actors.config.examples:hello" }
    """,
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    replica = Replica(tmp_path / "claimd.toml", loaded)
    task = asyncio.create_task(replica.run())
    settings = loaded.settings
    admin = await JetStreamBroker.connect(settings.nats_url, settings.stream, settings.subject)
    try:

        async def succeeded_at_least(n: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return (
                    await store.pool.fetchval(
                        "SELECT count(*) FROM job_runs WHERE state = 'succeeded'"
                    )
                    >= n
                )

            return check

        await eventually(await succeeded_at_least(1))
        # The broker loses the stream (recreated without its data).
        await admin.js.delete_stream(settings.stream)
        before = await store.pool.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'succeeded'"
        )
        await eventually(await succeeded_at_least(before + 3), timeout=40)
    finally:
        replica.stop_requested.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        with contextlib.suppress(Exception):
            await admin.js.delete_stream(settings.stream)
        await admin.close()

"""Stopping and losing the stream: bounded, clean, nothing left stuck."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.app import Replica
from actors.config import LoadedConfig
from tests.integration.helpers import Replicas, eventually

pytestmark = pytest.mark.integration


async def test_sigterm_with_a_sync_job_past_the_grace_exits_and_hands_the_run_back(
        make_config: Callable[..., LoadedConfig], store: PostgresRunStore,
        tmp_path: Path) -> None:
    make_config("""
        [jobs.stuck]
        every = "1h"
        run = { python = "tests.integration.slow_jobs:sleep_sync" }
    """, shutdown_grace="1s", claim_interval="50ms", materialize_interval="200ms")
    config = tmp_path / "claimd.toml"
    replicas = Replicas(tmp_path)
    try:
        proc = await replicas.start(config, "r1")
        async def job_known() -> bool:
            return bool(await store.pool.fetchval("SELECT count(*) FROM jobs"))
        await eventually(job_known)
        await store.pool.execute(
            "INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger) "
            "SELECT id, now(), now(), 'manual' FROM jobs")

        async def running() -> bool:
            return await store.pool.fetchval(
                "SELECT count(*) FROM job_runs WHERE state = 'running'") == 1
        await eventually(running)
        proc.send_signal(signal.SIGTERM)
        # A thread of the default executor would keep the process alive for the
        # whole 120 s sleep; grace + margin is the most a stop may take.
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await replicas.stop_all()
    row = await store.pool.fetchrow(
        "SELECT state, attempt FROM job_runs WHERE trigger = 'manual'")
    # Handed back at once, its attempt number not used up.
    assert (row["state"], row["attempt"]) == ("pending", 1)
    outcomes = [r["outcome"] for r in await store.pool.fetch(
        "SELECT outcome FROM job_run_attempts")]
    assert outcomes == ["interrupted"]


async def test_dispatch_recovers_when_the_stream_is_deleted_under_it(
        make_config: Callable[..., LoadedConfig], store: PostgresRunStore,
        tmp_path: Path) -> None:
    from actors.adapters.nats import JetStreamBroker

    loaded = make_config("""
        [jobs.tick]
        every = "1s"
        run = { python = "actors.examples:hello" }
    """, claim_interval="50ms", materialize_interval="200ms")
    replica = Replica(tmp_path / "claimd.toml", loaded)
    task = asyncio.create_task(replica.run())
    settings = loaded.settings
    admin = await JetStreamBroker.connect(settings.nats_url, settings.stream, settings.subject)
    try:
        async def succeeded_at_least(n: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return await store.pool.fetchval(
                    "SELECT count(*) FROM job_runs WHERE state = 'succeeded'") >= n
            return check

        await eventually(await succeeded_at_least(1))
        # The broker loses the stream (recreated without its data).
        await admin.js.delete_stream(settings.stream)
        before = await store.pool.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
        await eventually(await succeeded_at_least(before + 3), timeout=40)
    finally:
        replica.stop_requested.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        with contextlib.suppress(Exception):
            await admin.js.delete_stream(settings.stream)
        await admin.close()

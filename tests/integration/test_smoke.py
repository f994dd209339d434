"""The whole chain in one process on the real servers: a due run is executed and recorded once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from actors.app import Replica
from actors.config import LoadedConfig

pytestmark = pytest.mark.integration


async def test_replica_runs_a_due_job_once(make_config: Callable[..., LoadedConfig],
                                           store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    loaded = make_config("""
        [jobs.tick]
        every = "1s"
        run = { python = "actors.examples:hello" }
    """, claim_interval="50ms", materialize_interval="200ms")
    replica = Replica(tmp_path / "claimd.toml", loaded)
    task = asyncio.create_task(replica.run())
    try:
        async with asyncio.timeout(20):
            while True:
                done = await store.pool.fetchval(
                    "SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
                if done >= 2:
                    break
                await asyncio.sleep(0.1)
    finally:
        replica.stop_requested.set()
        await asyncio.wait_for(task, 30)
    doubles = await store.pool.fetchval(
        "SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs "
        "GROUP BY 1, 2 HAVING count(*) > 1) d")
    assert doubles == 0
    attempts = await store.pool.fetch(
        "SELECT run_id, count(*) AS n FROM job_run_attempts GROUP BY run_id HAVING count(*) > 1")
    assert attempts == []

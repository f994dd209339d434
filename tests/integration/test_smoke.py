"""The whole chain in one process on the real servers: a due run is executed and recorded once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import eventually, running, succeeded_runs

pytestmark = pytest.mark.integration


async def test_replica_runs_a_due_job_once(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    loaded = make_config(
        """
        [jobs.tick]
        every = "1s"
        run = { python = "actors.config.examples:hello" }
    """,
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    async with running(Replica(tmp_path / "claimd.toml", loaded)):

        async def two_succeeded() -> bool:
            return await succeeded_runs(store) >= 2

        await eventually(two_succeeded)
    doubles = await store.pool.fetchval(
        "SELECT count(*) FROM (SELECT job_id, scheduled_at FROM job_runs "
        "GROUP BY 1, 2 HAVING count(*) > 1) d"
    )
    assert doubles == 0
    attempts = await store.pool.fetch(
        "SELECT run_id, count(*) AS n FROM job_run_attempts GROUP BY run_id HAVING count(*) > 1"
    )
    assert attempts == []

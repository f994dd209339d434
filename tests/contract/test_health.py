"""Both stores speak the port the same way (actors.ports.translator): an outage leaves a
call as StoreUnavailable naming it, and the store's health is told; an answered read
says the server is reachable, an accepted write that writes go through."""

from __future__ import annotations

import pytest

from actors.observability import DependencyHealth, DependencyState
from actors.ports import ReplicaStore, StoreUnavailable
from tests.contract.jobs import job
from tests.contract.rows import Rows


async def test_an_outage_is_store_unavailable_and_the_health_follows_the_calls(
    store: ReplicaStore, rows: Rows
) -> None:
    health = DependencyHealth("contract")
    store.health = health  # type: ignore[attr-defined]  # both stores have one
    assert await store.sync_jobs([job()]) == {"job": "added"}
    assert health.up  # a write accepted
    async with rows.outage():
        with pytest.raises(StoreUnavailable, match=r"^active_jobs: "):
            await store.active_jobs()
        assert health.up is False
        assert health.reason.startswith("active_jobs: ")
        with pytest.raises(StoreUnavailable, match=r"^sync_jobs: "):
            await store.sync_jobs([job()])
        assert health.state is DependencyState.UNREACHABLE
    assert set(await store.active_jobs()) == {"job"}  # a read answered
    assert health.up

"""A first sync that meets a database outage is waited out, not a failed start.

bench_burst at 100,000 jobs saw a replica exit 1 at start: its first sync
timed out ("sync_jobs: TimeoutError", raised as StoreUnavailable) while the
other replica synced. The start now waits the outage out as the connect does,
and the replica runs once the sync goes through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from structlog.testing import capture_logs

from actors.domain import Job
from actors.ports import StoreUnavailable
from actors.replica import Replica
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.testing.memory_replica import MemoryPorts
from tests.unit.memory_world import until
from tests.unit.test_replica_in_memory import Executions, config


class FirstSyncTimesOut(InMemoryRunStore):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.sync_attempts = 0

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]:
        self.sync_attempts += 1
        if self.sync_attempts == 1:
            raise StoreUnavailable("sync_jobs: TimeoutError")
        return await super().sync_jobs(jobs, keep)


async def test_a_replica_whose_first_sync_times_out_syncs_again_and_runs(tmp_path: Path) -> None:
    store = FirstSyncTimesOut(ManualClock())
    bundle = MemoryPorts(store, InMemoryBroker(), Executions(), MemoryInbox())
    replica = Replica(tmp_path / "claimd.toml", config(tmp_path), bundle=bundle)
    with capture_logs() as logs:
        task = asyncio.create_task(replica.run())
        try:
            await until(lambda: len(store.runs) > 0, "the materializer planned the horizon")
            assert not task.done()
        finally:
            replica.stop_requested.set()
            await asyncio.wait_for(task, 30)
    assert store.sync_attempts == 2
    assert any("syncing the jobs" in e["event"] for e in logs if e["log_level"] == "warning")

"""A whole Replica on in-memory adapters: every scheduled instant runs once.

The replica as `claimd run` wires it (materializer, claimer, dispatcher,
compensator, reaper, worker, supervised, with the stop's order), but on the
in-memory store, broker and executor: the test moves the store's clock
instant by instant and sees each one planned, claimed, published, started,
executed and recorded once. Deterministic in what it asserts; the proof on
real servers is tests/integration/test_smoke.py and the fault harness.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from actors.config import LoadedConfig, parse_config
from actors.domain import ExecutionResult, ExecutorSpec, Outcome, RunContext, RunState
from actors.replica import Replica
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.testing.memory_replica import MemoryAdapters
from tests.unit.memory_world import until

pytestmark = pytest.mark.timeout(60)

SETTINGS = {
    "deployment": "mem",
    "http": "off",
    "claim_interval": "5ms",
    "materialize_interval": "5ms",
    "reap_interval": "20ms",
    "horizon": "30s",
    "worker_concurrency": 8,
}
JOBS = """
[jobs.tick]
every = "10s"
run = { python = "tests.unit.jobfuncs:sync_job" }

[jobs.tock]
every = "15s"
run = { python = "tests.unit.jobfuncs:sync_job" }
"""


def config(tmp_path: Path) -> LoadedConfig:
    lines = [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}" for k, v in SETTINGS.items()]
    text = "[claimd]\n" + "\n".join(lines) + "\n" + textwrap.dedent(JOBS)
    path = tmp_path / "claimd.toml"
    path.write_text(text)
    return parse_config(text, str(path), env={})


class Executions:
    """The Executor port: records every execution, succeeds."""

    def __init__(self) -> None:
        self.seen: list[RunContext] = []

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        self.seen.append(context)
        return ExecutionResult(Outcome.SUCCEEDED)


def instants(every: timedelta, start: datetime, end: datetime) -> list[datetime]:
    """The instants of an interval schedule in (start, end]: a new job starts after now."""
    epoch = datetime(1970, 1, 1, tzinfo=start.tzinfo)
    first = start + every - (start - epoch) % every
    out = []
    while first <= end:
        out.append(first)
        first += every
    return out


async def test_a_replica_on_memory_adapters_runs_every_instant_once(tmp_path: Path) -> None:
    clock = ManualClock()
    start = clock.now()
    store = InMemoryRunStore(clock)
    broker = InMemoryBroker()
    executions = Executions()
    inbox = MemoryInbox()
    adapters = MemoryAdapters(store, broker, executions, inbox)
    replica = Replica(tmp_path / "claimd.toml", config(tmp_path), adapters=adapters)
    task = asyncio.create_task(replica.run())
    try:
        await until(lambda: len(store.runs) > 0, "the materializer planned the horizon")
        for _ in range(6):  # one minute, ten seconds at a time
            clock.advance(timedelta(seconds=10))
            now = clock.now()

            def recorded(now: datetime = now) -> bool:
                due = [r for r in store.runs.values() if r.due_at <= now]
                return all(r.state is RunState.SUCCEEDED for r in due)

            await until(recorded, f"every run due by {now} recorded")
    finally:
        replica.stop_requested.set()
        await asyncio.wait_for(task, 30)
    end = clock.now()
    expected = {("tick", t) for t in instants(timedelta(seconds=10), start, end)} | {
        ("tock", t) for t in instants(timedelta(seconds=15), start, end)
    }
    ran = Counter((c.job, c.scheduled_at) for c in executions.seen)
    assert set(ran) == expected
    assert max(ran.values()) == 1  # none executed twice
    succeeded = {
        (r.job, r.scheduled_at) for r in store.runs.values() if r.state is RunState.SUCCEEDED
    }
    assert succeeded == expected
    # Each published once (one claim, one epoch), acked once, never terminated.
    assert Counter(m.msg_id for m in broker.published).most_common(1)[0][1] == 1
    assert len(inbox.acked) == len(expected)
    assert inbox.termed == []
    assert all(c.fencing_token == 1 for c in executions.seen)
    assert store.closed  # the stop closed the store
    assert not replica.forced_stop

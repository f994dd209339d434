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
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from actors.config import LoadedConfig, parse_config
from actors.domain import ExecutionResult, ExecutorSpec, Outcome, RunContext, RunState
from actors.ports import DispatchMessage, StoreUnavailable
from actors.replica import Replica
from actors.replica.reload import JobsConfig
from actors.replica.status import ReplicaStatus
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.testing.memory_replica import MEMORY_HEALTH, MemoryPorts
from tests.unit.memory_world import until

pytestmark = pytest.mark.timeout(180)

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

    def runs_inline(self, executor: str | None) -> bool:
        return False

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


@dataclass
class Minute:
    """What a replica on memory adapters did in one minute of the store's clock."""

    store: InMemoryRunStore
    broker: InMemoryBroker
    inbox: MemoryInbox
    executions: Executions
    replica: Replica
    expected: set[tuple[str, datetime]]  # (job, instant) the schedules made due

    def ran(self) -> Counter[tuple[str, datetime]]:
        return Counter((c.job, c.scheduled_at) for c in self.executions.seen)


async def run_a_minute(tmp_path: Path, broker: InMemoryBroker) -> Minute:
    """Run a replica and move the clock a minute, ten seconds at a time, each step once
    every run due by then is recorded; then stop it."""
    clock = ManualClock()
    start = clock.now()
    store = InMemoryRunStore(clock)
    executions = Executions()
    inbox = MemoryInbox()
    bundle = MemoryPorts(store, broker, executions, inbox)
    replica = Replica(tmp_path / "claimd.toml", config(tmp_path), bundle=bundle)
    task = asyncio.create_task(replica.run())
    try:
        await until(lambda: len(store.runs) > 0, "the materializer planned the horizon")
        for _ in range(6):
            clock.advance(timedelta(seconds=10))
            now = clock.now()

            def recorded(now: datetime = now) -> bool:
                due = [r for r in store.runs.values() if r.due_at <= now]
                return all(r.state is RunState.SUCCEEDED for r in due)

            # A deadline, not a wait: a step settles in milliseconds. (It took 1-5 s,
            # 30 s on a loaded machine, while the worker's hold slept through the
            # clock's jumps and its estimate of the store's clock lagged it by half
            # a real round trip: see actors/worker/claimed_ahead.py and MemoryPorts.)
            await until(recorded, f"every run due by {now} recorded")
    finally:
        replica.stop_requested.set()
        await asyncio.wait_for(task, 30)
    end = clock.now()
    expected = {("tick", t) for t in instants(timedelta(seconds=10), start, end)} | {
        ("tock", t) for t in instants(timedelta(seconds=15), start, end)
    }
    return Minute(store, broker, inbox, executions, replica, expected)


async def test_a_replica_on_memory_adapters_runs_every_instant_once(tmp_path: Path) -> None:
    minute = await run_a_minute(tmp_path, InMemoryBroker())
    ran = minute.ran()
    assert set(ran) == minute.expected
    assert len(minute.expected) == 10  # six ticks, four tocks
    assert max(ran.values()) == 1  # none executed twice
    store = minute.store
    succeeded = {
        (r.job, r.scheduled_at) for r in store.runs.values() if r.state is RunState.SUCCEEDED
    }
    assert succeeded == minute.expected
    # Each published once (one claim, one epoch), acked once, never terminated.
    assert Counter(m.msg_id for m in minute.broker.published).most_common(1)[0][1] == 1
    assert len(minute.inbox.acked) == len(minute.expected)
    assert minute.inbox.termed == []
    assert all(c.fencing_token == 1 for c in minute.executions.seen)
    assert store.closed  # the stop closed the store
    assert not minute.replica.forced_stop


async def test_runs_whose_publish_failed_are_released_and_run_once_under_a_new_claim(
    tmp_path: Path,
) -> None:
    broker = InMemoryBroker()
    failed: list[str] = []

    def first_two_fail(message: DispatchMessage) -> BaseException | None:
        if len(failed) < 2:
            failed.append(message.run_id)
            return ConnectionError("broker away (in-memory fault)")
        return None

    broker.fail = first_two_fail
    minute = await run_a_minute(tmp_path, broker)
    ran = minute.ran()
    assert set(ran) == minute.expected
    assert max(ran.values()) == 1
    tokens = {c.run_id: c.fencing_token for c in minute.executions.seen}
    # Released to pending by the compensator, claimed again: a new epoch each time.
    assert {run_id: tokens[run_id] for run_id in failed} == {
        run_id: 1 + failed.count(run_id) for run_id in failed
    }
    assert {t for run_id, t in tokens.items() if run_id not in failed} == {1}
    assert minute.store.in_state(RunState.CLAIMED, RunState.RUNNING) == []  # none left behind
    assert len(minute.broker.published) == len(minute.expected)


async def test_the_memory_replicas_estimate_of_the_store_clock_is_that_clock() -> None:
    # Round trips timed on the manual clock take no time there: no skew between
    # the store's clock and itself, so a run due at the test's instant is due on
    # the worker's estimate too (timed on the real clock, the estimate lagged).
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    bundle = MemoryPorts(store, InMemoryBroker(), Executions(), MemoryInbox())
    database = bundle.database_clock(store)
    for _ in range(20):
        await database.read()
        assert database.now() == clock.now()
        clock.advance(timedelta(seconds=10))
        assert database.now() == clock.now()


async def test_readiness_asks_each_port_for_a_round_trip() -> None:
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    broker = InMemoryBroker()
    status = ReplicaStatus(MEMORY_HEALTH, MEMORY_HEALTH)
    assert await status.ready() == {"postgres": "not connected", "nats": "not connected"}
    status.connected(store)
    status.broker = broker
    assert await status.ready() == {"postgres": "ok", "nats": "ok"}
    store.outage = StoreUnavailable("restarting")
    broker.down = ConnectionError("gone")
    verdicts = await status.ready()
    assert "restarting" in verdicts["postgres"]
    assert "in-memory broker down" in verdicts["nats"]
    store.outage = None
    broker.down = None
    assert await status.ready() == {"postgres": "ok", "nats": "ok"}


async def test_a_reload_with_errors_changes_nothing_and_is_recorded(tmp_path: Path) -> None:
    store = InMemoryRunStore(ManualClock())
    loaded = config(tmp_path)
    jobs = JobsConfig(tmp_path / "claimd.toml", loaded, syncs_jobs=True)
    await jobs.sync_at_start(store, "replica-a")
    assert set(store.jobs) == {"tick", "tock"}
    path = tmp_path / "claimd.toml"
    path.write_text(
        path.read_text() + '\n[jobs.broken]\nevery = "soon"\nrun = { python = "x:y" }\n'
    )
    assert await jobs.reload(store, "replica-a") is False
    assert set(jobs.jobs) == {"tick", "tock"}
    # The refused file's bad job is on record and in the metric until a reload fixes it.
    assert [(r.job, r.field) for r in store.rejected.values()] == [("broken", "every")]
    assert REGISTRY.get_sample_value("claimd_config_job_rejected", {"claimd_job": "broken"}) == 1
    assert REGISTRY.get_sample_value("claimd_config_job_errors") == 1
    path.write_text(path.read_text().split("[jobs.tock]")[0])  # tock gone, broken too
    assert await jobs.reload(store, "replica-a") is True
    assert set(jobs.jobs) == {"tick"}
    assert [j.name for j in store.jobs.values() if j.enabled] == ["tick"]
    assert store.rejected == {}
    assert REGISTRY.get_sample_value("claimd_config_job_rejected", {"claimd_job": "broken"}) is None
    assert REGISTRY.get_sample_value("claimd_config_job_errors") == 0
    assert [(a["ok"], a["origin"]) for a in store.actions] == [
        (False, "replica-a"),
        (True, "replica-a"),
    ]


async def test_not_ready_until_the_stream_is_prepared(tmp_path: Path) -> None:
    """/readyz's verdict: a replica whose stream is still being prepared is not ready
    (it was 200 then, and a reader of job_runs or of the 'replica started' line raced it)."""
    store = InMemoryRunStore(ManualClock())
    preparing, prepared = asyncio.Event(), asyncio.Event()

    class SlowStream(MemoryPorts):
        async def prepare_broker(self, broker: object) -> None:
            preparing.set()
            await prepared.wait()

    bundle = SlowStream(store, InMemoryBroker(), Executions(), MemoryInbox())
    replica = Replica(tmp_path / "claimd.toml", config(tmp_path), bundle=bundle)
    task = asyncio.create_task(replica.run())
    try:
        await asyncio.wait_for(preparing.wait(), 10)
        assert (await replica.status.ready())["nats"] == "not connected"
        prepared.set()

        async def nats_ok() -> bool:
            return (await replica.status.ready())["nats"] == "ok"

        async with asyncio.timeout(10):
            while not await nats_ok():
                await asyncio.sleep(0.01)
    finally:
        prepared.set()
        replica.stop_requested.set()
        await asyncio.wait_for(task, 30)

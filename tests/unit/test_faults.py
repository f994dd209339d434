"""The chaos harness's broken builds: wrappers of its own, composed only when asked for."""

from __future__ import annotations

from typing import Any, cast

import pytest

from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion, DispatchMessage
from actors.replica.production import ProductionPorts
from actors.testing.memory import InMemoryBroker
from tests.chaos.broken import (
    EXIT_STATUS,
    BrokenPorts,
    ExitAfterComplete,
    FailingPublishes,
    Faults,
    UnfencedCompletions,
)
from tests.chaos.broken_replica import build_parser
from tests.fakes import WorkerStore
from tests.unit.memory_world import T0


def dispatch(run_id: str) -> DispatchMessage:
    return DispatchMessage(run_id, 1, "job", T0, 1, "d")


def test_faults_round_trip_through_the_entry_points_options() -> None:
    assert not Faults()
    assert Faults().args() == []
    faults = Faults(skip_epoch_guard=True, exit_after_complete=2, publish_fail_every=3)
    assert faults
    args = build_parser().parse_args([*faults.args(), "run", "--config", "c.toml"])
    parsed = Faults(args.skip_epoch_guard, args.exit_after_complete, args.publish_fail_every)
    assert parsed == faults


def test_no_fault_leaves_the_worker_store_as_production_has_it() -> None:
    store = WorkerStore().as_port()
    settings: Any = None
    broken = BrokenPorts(settings, "r", faults=Faults())
    assert broken.worker_store(cast(Any, store)) is store
    assert ProductionPorts(settings, "r").worker_store(cast(Any, store)) is store
    wrapped = BrokenPorts(settings, "r", faults=Faults(exit_after_complete=1))
    assert isinstance(wrapped.worker_store(cast(Any, store)), ExitAfterComplete)
    # Forging epochs needs the PostgreSQL store's pool: asked of another store, it refuses.
    forged = BrokenPorts(settings, "r", faults=Faults(skip_epoch_guard=True))
    with pytest.raises(AssertionError, match="opened by ProductionPorts"):
        forged.worker_store(cast(Any, store))


async def test_unfenced_completions_carry_the_epoch_the_run_holds_now() -> None:
    class Pool:
        async def fetch(self, _sql: str, ids: list[str]) -> list[dict[str, Any]]:
            return [{"id": "a", "claim_epoch": 7}]  # "b" is not running any more

    store = WorkerStore().as_port()
    unfenced = UnfencedCompletions(store, cast(Any, Pool()))
    late = [
        Completion(run_id, 1, ExecutionResult(Outcome.SUCCEEDED), None, "zombie")
        for run_id in ("a", "b")
    ]
    await unfenced.complete_runs(late)
    recorded = cast(WorkerStore, store).recorded
    assert [(c.run_id, c.epoch) for c in recorded] == [("a", 7), ("b", 1)]


async def test_the_exit_after_complete_exits_after_the_nth_recorded_batch() -> None:
    store = WorkerStore().as_port()
    exits: list[int] = []
    wrapped = ExitAfterComplete(store, 2, exit=exits.append)
    verdict = Completion("a", 1, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await wrapped.complete_runs([verdict]) == {("a", 1)}
    assert exits == []
    await wrapped.complete_runs([verdict])
    assert exits == [EXIT_STATUS]  # after the 2nd batch was recorded, before it returned
    assert len(cast(WorkerStore, store).recorded) == 2
    await wrapped.ping()  # everything else is the store's own


async def test_failing_publishes_fail_every_nth() -> None:
    broker = InMemoryBroker()
    failing = FailingPublishes(broker, 3)
    messages = [dispatch(f"r{i}") for i in range(7)]
    results = await failing.publish_many(messages[:4]) + await failing.publish_many(messages[4:])
    assert [r is None for r in results] == [True, True, False, True, True, False, True]
    assert [m.run_id for m in broker.published] == ["r0", "r1", "r3", "r4", "r6"]
    assert failing.publish_timeout == broker.publish_timeout  # the rest is the broker's

"""The harness's broken build is installed at start-up, only when asked for."""

from __future__ import annotations

from typing import Any, cast

from actors.adapters.postgres import COMPLETE_RUNS, PostgresRunStore
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion, DispatchMessage
from actors.testing.faults import (
    EXIT_AFTER_COMPLETE,
    EXIT_STATUS,
    PUBLISH_FAIL_EVERY,
    SKIP_EPOCH_GUARD,
    ExitAfterComplete,
    install_broker_faults,
    install_store_faults,
    install_worker_faults,
)
from actors.testing.memory import InMemoryBroker
from tests.fakes import WorkerStore
from tests.unit.memory_world import T0


def dispatch(run_id: str) -> DispatchMessage:
    return DispatchMessage(run_id, 1, "job", T0, 1, "d")


def test_the_unfenced_completion_is_installed_only_when_the_harness_asks() -> None:
    store = PostgresRunStore(cast(Any, None))
    assert install_store_faults(store, {}).complete_statement == COMPLETE_RUNS
    assert install_store_faults(store, {SKIP_EPOCH_GUARD: "0"}).complete_statement == (
        COMPLETE_RUNS
    )
    broken = install_store_faults(store, {SKIP_EPOCH_GUARD: "1"}).complete_statement
    assert "r.claim_epoch = c.epoch" in COMPLETE_RUNS
    assert "r.claim_epoch = c.epoch" not in broken


async def test_the_exit_after_complete_is_a_store_wrapper_installed_only_when_asked() -> None:
    store = WorkerStore().as_port()
    assert install_worker_faults(store, {}) is store
    assert install_worker_faults(store, {EXIT_AFTER_COMPLETE: "0"}) is store
    assert isinstance(install_worker_faults(store, {EXIT_AFTER_COMPLETE: "1"}), ExitAfterComplete)
    exits: list[int] = []
    wrapped = ExitAfterComplete(store, 2, exit=exits.append)
    verdict = Completion("a", 1, ExecutionResult(Outcome.SUCCEEDED), None, "w")
    assert await wrapped.complete_runs([verdict]) == {("a", 1)}
    assert exits == []
    await wrapped.complete_runs([verdict])
    assert exits == [EXIT_STATUS]  # after the 2nd batch was recorded, before it returned
    assert len(cast(WorkerStore, store).recorded) == 2
    await wrapped.ping()  # everything else is the store's own


async def test_failing_publishes_are_installed_only_when_asked_and_fail_every_nth() -> None:
    broker = InMemoryBroker()
    assert install_broker_faults(broker, {}) is broker
    assert install_broker_faults(broker, {PUBLISH_FAIL_EVERY: "0"}) is broker
    failing = install_broker_faults(broker, {PUBLISH_FAIL_EVERY: "3"})
    messages = [dispatch(f"r{i}") for i in range(7)]
    results = await failing.publish_many(messages[:4]) + await failing.publish_many(messages[4:])
    assert [r is None for r in results] == [True, True, False, True, True, False, True]
    assert [m.run_id for m in broker.published] == ["r0", "r1", "r3", "r4", "r6"]
    assert failing.publish_timeout == broker.publish_timeout  # the rest is the broker's

"""The harness's broken build is installed at start-up, only when asked for."""

from __future__ import annotations

from typing import Any, cast

from actors.adapters.postgres import COMPLETE_RUNS, PostgresRunStore
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion
from actors.testing.faults import (
    EXIT_AFTER_COMPLETE,
    EXIT_STATUS,
    SKIP_EPOCH_GUARD,
    ExitAfterComplete,
    install_store_faults,
    install_worker_faults,
)
from tests.fakes import WorkerStore


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

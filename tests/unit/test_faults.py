"""The harness's broken build is installed at start-up, only when asked for."""

from __future__ import annotations

from typing import Any, cast

from actors.adapters.postgres import COMPLETE_RUNS, PostgresRunStore
from actors.testing.faults import SKIP_EPOCH_GUARD, install_store_faults


def test_the_unfenced_completion_is_installed_only_when_the_harness_asks() -> None:
    store = PostgresRunStore(cast(Any, None))
    assert install_store_faults(store, {}).complete_statement == COMPLETE_RUNS
    assert install_store_faults(store, {SKIP_EPOCH_GUARD: "0"}).complete_statement == (
        COMPLETE_RUNS
    )
    broken = install_store_faults(store, {SKIP_EPOCH_GUARD: "1"}).complete_statement
    assert "r.claim_epoch = c.epoch" in COMPLETE_RUNS
    assert "r.claim_epoch = c.epoch" not in broken

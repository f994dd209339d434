"""The claim's second statement (forbid/queue jobs): errors by kind.

A fake pool stands in for PostgreSQL: what is tested is how claim_due_runs
treats a failure of CLAIM_EXCLUSIVE_RUNS after CLAIM_DUE_RUNS has claimed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
import pytest

from actors.adapters.postgres import CLAIM_EXCLUSIVE_RUNS, PostgresRunStore
from actors.ports import StoreUnavailable


class FailingExclusiveClaim:
    """Claims one run in the first statement; the exclusive one raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def fetchval(self, query: str, *args: Any) -> int:
        return 0  # nothing claimed yet: room for the whole batch

    async def fetch(self, query: str, *args: Any) -> list[dict[str, Any]]:
        if query == CLAIM_EXCLUSIVE_RUNS:
            raise self.error
        return [
            {
                "id": "r1",
                "name": "job",
                "scheduled_at": datetime.now(UTC),
                "attempt": 1,
                "claim_epoch": 1,
                "skip": None,
                "due_at": datetime.now(UTC),
            }
        ]


def _store(error: Exception) -> PostgresRunStore:
    return PostgresRunStore(cast(asyncpg.Pool, FailingExclusiveClaim(error)))


async def test_an_outage_in_the_exclusive_claim_passes_on_the_first_claims() -> None:
    store = _store(ConnectionResetError("connection reset"))
    claimed = await store.claim_due_runs("me", 10, timedelta(minutes=1), 100)
    assert [c.run_id for c in claimed] == ["r1"]


async def test_a_bug_in_the_exclusive_claim_reaches_the_caller() -> None:
    # Before: logged as a warning and passed over on every pass, so forbid and
    # queue jobs never ran while other jobs had due runs.
    store = _store(asyncpg.UndefinedColumnError("column r.nope does not exist"))
    with pytest.raises(asyncpg.UndefinedColumnError):
        await store.claim_due_runs("me", 10, timedelta(minutes=1), 100)


async def test_an_outage_with_nothing_claimed_is_reported_as_one() -> None:
    class NothingClaimed(FailingExclusiveClaim):
        async def fetchval(self, query: str, *args: Any) -> int:
            return 100  # the in-flight bound is full: the first statement claims nothing

    store = PostgresRunStore(
        cast(asyncpg.Pool, NothingClaimed(ConnectionResetError("connection reset")))
    )
    with pytest.raises(StoreUnavailable):
        await store.claim_due_runs("me", 10, timedelta(minutes=1), 100)

"""The completion's epoch fence, by behaviour: a zombie's late verdict changes nothing.

The run the zombie worked on was reaped, claimed again and started again, so
it is ``running`` once more: only the epoch tells the two attempts apart (a
zombie completing a run that is terminal, or pending, is refused by the state
alone; tests/integration/test_reaper.py). The zombie's completion arrives in
the same batch as a current one, as completions are recorded in batches.
"""

from __future__ import annotations

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.domain import ExecutionResult, Outcome
from actors.ports import Completion
from tests.integration.helpers import (
    LONG_LEASE,
    add_job,
    insert_due_runs,
    make_job,
    message_for,
)

pytestmark = pytest.mark.integration

EXPIRED = "UPDATE job_runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1"
# The whole of what a completion writes, to see that a refused one wrote nothing.
ROW = """
SELECT state, attempt, claim_epoch, lease_owner, lease_expires_at, started_at, finished_at,
       outcome, exit_code, error, output_tail, updated_at
  FROM job_runs WHERE id = $1
"""
ATTEMPTS = """
SELECT attempt, claim_epoch, outcome, worker FROM job_run_attempts
 WHERE run_id = $1 ORDER BY attempt, claim_epoch
"""


async def test_a_zombie_completing_a_run_started_again_is_refused_and_overwrites_nothing(
    store: PostgresRunStore,
) -> None:
    job_id = await add_job(store, make_job(max_attempts=3))
    reclaimed, bystander = await insert_due_runs(store, job_id, 2)
    claimed = await store.claim_due_runs("replica-a", 2, LONG_LEASE, max_claimed=10)
    first = next(r for r in claimed if r.run_id == reclaimed)
    other = next(r for r in claimed if r.run_id == bystander)
    started, _ = await store.start_runs(
        "zombie", [message_for(first, "d"), message_for(other, "d")], LONG_LEASE
    )
    assert len(started) == 2

    # The zombie's lease on one run expires; the reaper returns the run and
    # another replica claims and starts it: running again, under epoch 2.
    await store.pool.execute(EXPIRED, reclaimed)
    assert await store.reap_expired_leases(10) == [(reclaimed, "job", "running->pending")]
    [again] = await store.claim_due_runs("replica-b", 2, LONG_LEASE, max_claimed=10)
    assert (again.run_id, again.epoch, again.attempt) == (reclaimed, 2, 2)
    started, _ = await store.start_runs("alive", [message_for(again, "d")], LONG_LEASE)
    assert [s.run_id for s in started] == [reclaimed]
    before = tuple(await store.pool.fetchrow(ROW, reclaimed))
    assert before[:4] == ("running", 2, 2, "alive")

    # The zombie wakes and records both of its executions in one batch.
    late = Completion(reclaimed, 1, ExecutionResult(Outcome.SUCCEEDED), None, "zombie")
    current = Completion(bystander, 1, ExecutionResult(Outcome.SUCCEEDED), None, "zombie")
    assert await store.complete_runs([late, current]) == {(bystander, 1)}

    # Refused: the newer attempt is exactly as it was, and the zombie's success
    # is nowhere on record (only the reaper's account of its attempt).
    assert tuple(await store.pool.fetchrow(ROW, reclaimed)) == before
    assert [tuple(a) for a in await store.pool.fetch(ATTEMPTS, reclaimed)] == [
        (1, 1, "lease_expired", "zombie")
    ]
    assert (await store.pool.fetchrow(ROW, bystander))["state"] == "succeeded"

    # The newer attempt still completes, under its own epoch.
    mine = Completion(reclaimed, 2, ExecutionResult(Outcome.FAILED, error="boom"), None, "alive")
    assert await store.complete_runs([mine]) == {(reclaimed, 2)}
    assert [tuple(a) for a in await store.pool.fetch(ATTEMPTS, reclaimed)] == [
        (1, 1, "lease_expired", "zombie"),
        (2, 2, "failed", "alive"),
    ]

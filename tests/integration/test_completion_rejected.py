"""A completion the database refuses does not block the others, nor the worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.ports import Completion, RecordRejected
from actors.replica import Replica
from tests.integration.helpers import (
    RARE_CRON,
    add_job,
    calls_of,
    consumer_counts,
    counter,
    eventually,
    insert_due_runs,
    jetstream_worker,
    make_job,
    message_for,
    running,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


class RefusesOneRun(PostgresRunStore):
    """The real store, except that any batch holding ``bad`` is refused as data."""

    bad = ""

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        if any(c.run_id == self.bad for c in completions):
            raise RecordRejected("refused for the test")
        return await super().complete_runs(completions)


async def test_a_rejected_completion_is_abandoned_to_the_lease_and_the_rest_recorded(
    store: PostgresRunStore, broker: JetStreamBroker, deployment: str
) -> None:
    job_id = await add_job(store, make_job())
    ids = await insert_due_runs(store, job_id, 6)
    claimed = await store.claim_due_runs("c", 10, timedelta(minutes=5), 100)
    assert len(claimed) == 6
    assert await broker.publish_many([message_for(r, deployment) for r in claimed]) == [None] * 6

    refusing = RefusesOneRun(store.pool)
    refusing.bad = ids[0]
    rejected_before = counter("claimd_completions_rejected_total")
    stop = asyncio.Event()
    worker = await jetstream_worker(
        refusing,
        broker,
        deployment,
        stop,
        concurrency=16,
        heartbeat=timedelta(milliseconds=200),
    )
    task = asyncio.create_task(worker.run())
    try:

        async def five_recorded() -> bool:
            return (
                await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
                == 5
            )

        await eventually(five_recorded)

        # The refused run is no longer heartbeated: nothing of it stays in flight.
        async def forgotten() -> bool:
            return not worker.in_flight

        await eventually(forgotten)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert counter("claimd_completions_rejected_total") == rejected_before + 1
    row = await store.pool.fetchrow(
        "SELECT state, lease_expires_at > now() AS live FROM job_runs WHERE id = $1::uuid", ids[0]
    )
    # Still running under a lease nobody extends: the reaper will take it back.
    assert row["state"] == "running"
    pending, _ = await consumer_counts(broker)
    assert pending == 0


# --- a completion that fails for a reason other than an outage ---------------------------
#
# The whole replica runs in this process (claimer, dispatcher, worker, reaper, all
# supervised) on the real servers; only the recording of one run's first attempt
# fails. The run must come back within a lease: reaped, run again under a newer
# epoch, recorded. Before the fix the worker retried such a completion forever
# while its heartbeat kept the lease alive, so the run stayed `running`.

FAST_LEASE = {
    "lease": "3s",
    "ack_wait": "500ms",
    "max_deliver": 2,
    "claim_interval": "50ms",
    "reap_interval": "100ms",
    "materialize_interval": "1s",
    "shutdown_grace": "1s",
}
RECORD_CALL = "tests.integration.helpers:record_call"
RECOVERY_DEADLINE = 30.0  # many leases of 3 s: a run stuck in `running` never gets there


async def _one_job_two_runs(
    store: PostgresRunStore, make_config: Callable[..., LoadedConfig]
) -> tuple[Replica, str, str]:
    loaded = make_config(
        f"""
        [jobs.flaky]
        cron = "{RARE_CRON}"
        max_attempts = 3
        run = {{ python = "{RECORD_CALL}" }}
        """,
        **FAST_LEASE,
    )
    job_id = await add_job(store, loaded.jobs["flaky"])
    bad, good = await insert_due_runs(store, job_id, 2)
    return Replica(Path(loaded.path), loaded), bad, good


async def _recovered(store: PostgresRunStore, run_id: str) -> asyncpg.Record:
    """Wait until the run is terminal (bounded); return its row."""

    async def terminal() -> bool:
        return await store.pool.fetchval(
            "SELECT state FROM job_runs WHERE id = $1::uuid", run_id
        ) in ("succeeded", "failed")

    await eventually(
        terminal,
        timeout=RECOVERY_DEADLINE,
        what="the run whose completion failed to be recovered and recorded",
    )
    row = await store.pool.fetchrow(
        "SELECT state, attempt, claim_epoch FROM job_runs WHERE id = $1::uuid", run_id
    )
    assert row is not None
    return row


async def _attempts(store: PostgresRunStore, run_id: str) -> list[tuple[int, str]]:
    rows = await store.pool.fetch(
        "SELECT claim_epoch, outcome FROM job_run_attempts WHERE run_id = $1::uuid "
        "ORDER BY claim_epoch",
        run_id,
    )
    return [(r["claim_epoch"], r["outcome"]) for r in rows]


async def test_an_unexpected_completion_error_reaches_the_supervisor_and_the_lease_recovers_the_run(
    store: PostgresRunStore,
    make_config: Callable[..., LoadedConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replica, bad, good = await _one_job_two_runs(store, make_config)
    real_complete = PostgresRunStore.complete_runs
    refused: list[int] = []

    async def complete_runs(
        self: PostgresRunStore, completions: Sequence[Completion]
    ) -> set[tuple[str, int]]:
        # A bug, not an outage nor a refusal of the data: what a broken code path raises.
        for c in completions:
            if c.run_id == bad and c.epoch == 1:
                refused.append(c.epoch)
                raise RuntimeError("injected: recording this completion is broken")
        return await real_complete(self, completions)

    monkeypatch.setattr(PostgresRunStore, "complete_runs", complete_runs)
    rejected_before = counter("claimd_completions_rejected_total")
    restarts_before = counter("claimd_actor_restarts_total", actor="worker")
    async with running(replica):
        row = await _recovered(store, bad)
        good_state = await store.pool.fetchval(
            "SELECT state FROM job_runs WHERE id = $1::uuid", good
        )
    assert (row["state"], row["claim_epoch"], row["attempt"]) == ("succeeded", 2, 2)
    assert good_state == "succeeded"
    # Executed once under the epoch that could not be recorded, once under the next.
    assert sorted(token for _, _, token in calls_of(bad)) == [1, 2]
    assert await _attempts(store, bad) == [(1, "lease_expired"), (2, "succeeded")]
    assert counter("claimd_completions_rejected_total") >= rejected_before + 1
    # A bug is a crash the supervisor counts, not a loop nobody sees.
    assert counter("claimd_actor_restarts_total", actor="worker") >= restarts_before + 1


REFUSE_FIRST_COMPLETION = """
CREATE TABLE refuse_completion_of (id uuid PRIMARY KEY, epoch bigint NOT NULL);
CREATE FUNCTION refuse_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM refuse_completion_of f
                WHERE f.id = OLD.id AND f.epoch = OLD.claim_epoch)
       AND NEW.outcome IS DISTINCT FROM 'lease_expired' THEN
        RAISE EXCEPTION 'completion of run % refused for the test', OLD.id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_completion BEFORE UPDATE ON job_runs FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state <> 'running') EXECUTE FUNCTION refuse_completion();
"""


async def test_a_completion_the_database_refuses_is_recovered_by_the_lease_and_not_run_twice(
    store: PostgresRunStore, make_config: Callable[..., LoadedConfig]
) -> None:
    replica, bad, good = await _one_job_two_runs(store, make_config)
    # A real refusal by PostgreSQL: a trigger rejects the completing UPDATE of the
    # bad run's first epoch (the reaper's update of it is let through).
    await store.pool.execute(REFUSE_FIRST_COMPLETION)
    await store.pool.execute("INSERT INTO refuse_completion_of VALUES ($1::uuid, 1)", bad)
    rejected_before = counter("claimd_completions_rejected_total")
    restarts_before = counter("claimd_actor_restarts_total", actor="worker")
    async with running(replica):
        row = await _recovered(store, bad)
        good_state = await store.pool.fetchval(
            "SELECT state FROM job_runs WHERE id = $1::uuid", good
        )
    assert (row["state"], row["claim_epoch"], row["attempt"]) == ("succeeded", 2, 2)
    assert good_state == "succeeded"
    # The unrecorded attempt's message is settled: no redelivery ran it again
    # under the same epoch (nor kept its lease alive).
    assert sorted(token for _, _, token in calls_of(bad)) == [1, 2]
    assert await _attempts(store, bad) == [(1, "lease_expired"), (2, "succeeded")]
    assert counter("claimd_completions_rejected_total") == rejected_before + 1
    # A refusal of one run's data is that run's: the worker was not restarted.
    assert counter("claimd_actor_restarts_total", actor="worker") == restarts_before

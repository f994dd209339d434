"""`claimd run` has no fault switch: with the old fault variables set, it still fences.

Through the real entry point (a `claimd run` subprocess, worker role): the test
plays the scheduler. The replica starts a run and keeps executing it; the run's
lease expires (the clock moved past it, as for a replica frozen that long), the
reaper returns it, and another worker claims and starts it again. Then the
zombie's execution finishes, and its late completion must be refused: the newer
attempt stays as it was.

The same scenario on the chaos harness's broken build (its own entry point, the
epoch guard removed) is the control: there the zombie's completion overwrites
the newer attempt, so the scenario does reach the fence and nothing else stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from tests.chaos.broken import Faults
from tests.integration.helpers import (
    LONG_LEASE,
    RARE_CRON,
    Replicas,
    add_job,
    consumer_counts,
    eventually,
    insert_due_runs,
    message_for,
)

pytestmark = pytest.mark.integration

EXPIRED = "UPDATE job_runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1"
FENCED = "completion fenced: the run moved on"


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[Replicas]:
    started = Replicas(tmp_path)
    yield started
    await started.stop_all()


def _release(fifo: Path) -> bool:
    """Let the job's ``cat`` end (EOF), once it has the pipe open; False until then."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return False
    os.close(fd)
    return True


def _events(log: Path, name: str) -> list[dict[str, object]]:
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if event.get("event") == name:
                    events.append(event)
    return events


@pytest.mark.parametrize("build", ["claimd-run", "broken-build"])
async def test_claimd_run_fences_a_zombie_whatever_the_fault_variables_say(
    tmp_path: Path,
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    broker: JetStreamBroker,
    deployment: str,
    replicas: Replicas,
    build: str,
) -> None:
    fifo = tmp_path / "finish"
    os.mkfifo(fifo)
    loaded = make_config(
        f"""
        [jobs.zombie]
        cron = "{RARE_CRON}"
        max_attempts = 3
        run = {{ shell = ["cat", "{fifo}"] }}
        """,
        # A long lease and ack_wait: the replica's first heartbeat comes after
        # lease / 4 = 150 s, long after this test is over, so the zombie does
        # not learn of its lost lease before its execution ends (it would cancel
        # the execution and never complete late).
        lease="10m",
        ack_wait="10m",
        max_deliver=1,
    )
    job_id = await add_job(store, loaded.jobs["zombie"])
    [run_id] = await insert_due_runs(store, job_id, 1)
    [first] = await store.claim_due_runs("scheduler", 1, LONG_LEASE, max_claimed=10)
    assert await broker.publish_many([message_for(first, deployment)]) == [None]

    config = tmp_path / "claimd.toml"
    if build == "claimd-run":
        # What `claimd run` used to honour (actors/testing/faults.py, removed),
        # set to show that nothing reads them any more: the first would let the
        # zombie overwrite the newer attempt, the second would make the replica
        # exit after recording, before acking.
        proc = await replicas.start(
            config,
            "zombie",
            role="worker",
            CLAIMD_FAULT_SKIP_EPOCH_GUARD="1",
            CLAIMD_FAULT_EXIT_AFTER_COMPLETE="1",
        )
    else:
        faults = Faults(skip_epoch_guard=True)
        proc = await replicas.start(config, "zombie", role="worker", faults=faults)

    async def row() -> tuple[str, int, str | None]:
        r = await store.pool.fetchrow(
            "SELECT state, claim_epoch, lease_owner FROM job_runs WHERE id = $1", run_id
        )
        assert r is not None
        return r["state"], r["claim_epoch"], r["lease_owner"]

    async def zombie_running() -> bool:
        state, _, owner = await row()
        return state == "running" and owner != "scheduler"

    await eventually(zombie_running, timeout=40, what="the replica starting the run")
    _, _, zombie = await row()
    assert zombie is not None

    # Its lease runs out; the reaper returns the run; another worker takes it.
    await store.pool.execute(EXPIRED, run_id)
    assert await store.reap_expired_leases(10) == [(run_id, "zombie", "running->pending")]
    [again] = await store.claim_due_runs("scheduler", 1, LONG_LEASE, max_claimed=10)
    assert (again.run_id, again.epoch, again.attempt) == (run_id, 2, 2)
    started, _ = await store.start_runs("usurper", [message_for(again, deployment)], LONG_LEASE)
    assert [s.run_id for s in started] == [run_id]
    assert await row() == ("running", 2, "usurper")

    # The zombie's execution ends; it records (or tries to), then acks.
    async def released() -> bool:
        return _release(fifo)

    await eventually(released, timeout=20, what="the job's cat reading the pipe")

    async def acked() -> bool:
        return await consumer_counts(broker) == (0, 0)

    await eventually(acked, timeout=30, what="the zombie acking its message")
    attempts = [
        tuple(a)
        for a in await store.pool.fetch(
            "SELECT attempt, claim_epoch, outcome, worker FROM job_run_attempts"
            " WHERE run_id = $1 ORDER BY attempt",
            run_id,
        )
    ]
    if build == "broken-build":
        # The control: without the guard the late completion lands on the newer attempt.
        assert (await row())[0] == "succeeded"
        assert (2, 2, "succeeded", zombie) in attempts
        return

    # Refused: the newer attempt is untouched, and only the reaper's record of
    # the zombie's attempt exists.
    assert await row() == ("running", 2, "usurper")
    assert attempts == [(1, 1, "lease_expired", zombie)]
    log = tmp_path / "zombie.log"
    assert [(e["run_id"], e["epoch"]) for e in _events(log, FENCED)] == [(run_id, 1)]
    # And it did not exit after recording (CLAIMD_FAULT_EXIT_AFTER_COMPLETE=1).
    assert proc.returncode is None, log.read_text()

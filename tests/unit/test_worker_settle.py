"""How the worker settles each delivery, on in-memory ports.

Recorded: ack. Fenced (the epoch moved on): ack, counted. Refused as data
(RecordRejected): term, the run left to its lease, the rest of the batch
recorded. Not started: ack, except an unknown run: term. Poison never reaches
the worker: the JetStream inbox terminates it (tests/unit/test_nats_inbox.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from actors.domain import Outcome, StartRefusal
from actors.ports import DispatchMessage, RecordRejected
from tests.fakes import dispatch, sample
from tests.unit.worker_rig import Rig, until

pytestmark = pytest.mark.timeout(30)


def _ids(messages: Sequence[DispatchMessage]) -> list[str]:
    return sorted(m.run_id for m in messages)


async def test_a_fenced_completion_is_acked_and_counted() -> None:
    rig = Rig()
    rig.store.fenced.add("a")
    fenced = sample("claimd_fenced_completions_total")
    completed = sample("claimd_runs_completed_total", claimd_job="job", outcome="succeeded")
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: _ids(rig.inbox.acked) == ["a"], "the fenced run's ack")
    assert sample("claimd_fenced_completions_total") == fenced + 1
    assert sample("claimd_runs_completed_total", claimd_job="job", outcome="succeeded") == (
        completed
    )
    assert not rig.worker.in_flight
    await rig.stopped()


async def test_a_completion_refused_as_data_is_terminated_and_the_rest_recorded() -> None:
    rig = Rig()
    rig.store.complete_errors["bad"] = RecordRejected("refused")
    rejected = sample("claimd_completions_rejected_total")
    for run_id in ("bad", "good-1", "good-2"):
        rig.inbox.put(dispatch(run_id))
    rig.start()
    await until(lambda: len(rig.executor.calls) == 3, "all three started")
    rig.executor.finish.set()
    await until(lambda: len(rig.inbox.acked) + len(rig.inbox.termed) == 3, "all settled")
    assert _ids(rig.inbox.termed) == ["bad"]
    assert _ids(rig.inbox.acked) == ["good-1", "good-2"]
    assert sorted(c.run_id for c in rig.store.recorded) == ["good-1", "good-2"]
    assert sample("claimd_completions_rejected_total") == rejected + 1
    assert not rig.worker.in_flight  # no longer heartbeated: its lease lapses
    assert rig.task is not None
    assert not rig.task.done()  # the worker goes on
    await rig.stopped()


async def test_a_failure_for_good_is_counted_and_acked() -> None:
    rig = Rig()
    rig.executor.outcome = Outcome.FAILED
    failed = sample("claimd_runs_failed_total", claimd_job="job")
    rig.executor.finish.set()
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: rig.inbox.acked == [message], "the ack")
    [completion] = rig.store.recorded
    assert completion.verdict is not None
    assert completion.verdict.retry  # attempt 1 of 3
    assert sample("claimd_runs_failed_total", claimd_job="job") == failed
    await rig.stopped()


@pytest.mark.parametrize(
    ("reason", "verdict"),
    [("unknown", "term"), ("terminal", "ack"), ("stale", "ack"), ("owned", "ack")],
)
async def test_a_delivery_that_starts_nothing_is_settled_by_why(reason: str, verdict: str) -> None:
    rig = Rig()
    rig.store.not_started["a"] = StartRefusal(reason)
    skipped = sample("claimd_deliveries_skipped_total", reason=reason)
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: bool(rig.inbox.deliveries and rig.inbox.deliveries[0].settled), "settled")
    assert rig.inbox.deliveries[0].settled == [verdict]
    assert rig.executor.calls == []
    assert sample("claimd_deliveries_skipped_total", reason=reason) == skipped + 1
    await rig.stopped()
    assert rig.inbox.pending == 0  # neither is delivered again


async def test_a_lease_lost_cancels_the_execution_and_acks_without_recording() -> None:
    rig = Rig(heartbeat_interval=timedelta(milliseconds=1))
    message = dispatch("a")
    extend = rig.store.extend_leases

    async def refused(worker: str, runs: object, lease: object) -> set[tuple[str, int]]:
        await extend(worker, [], rig.worker.settings.lease)
        return set()  # reaped meanwhile: not extended

    rig.store.extend_leases = refused  # type: ignore[method-assign]
    rig.inbox.put(message)
    rig.start()
    await until(lambda: rig.inbox.acked == [message], "the ack after the lease was lost")
    assert rig.executor.cancelled == ["a"]
    assert rig.store.recorded == []
    await rig.stopped()

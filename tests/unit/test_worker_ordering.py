"""The worker's order on in-memory ports: recorded before acked, never acked unrecorded.

What this buys on the real servers (a crash between record and ack leaves one
execution) is proved in tests/integration/test_worker.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from actors.domain import Outcome
from actors.ports import Completion, DispatchMessage
from tests.fakes import T0, dispatch, sample
from tests.unit.worker_rig import Rig, until

pytestmark = pytest.mark.timeout(30)


async def test_a_run_is_recorded_before_its_message_is_acked() -> None:
    rig = Rig()
    acked_when_recorded: list[list[DispatchMessage]] = []
    record = rig.store.complete_runs

    async def recording(completions: Sequence[Completion]) -> set[tuple[str, int]]:
        acked_when_recorded.append(list(rig.inbox.acked))
        return await record(completions)

    rig.store.complete_runs = recording  # type: ignore[method-assign]
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: rig.executor.calls == [("a", 1)], "the run to start")
    assert rig.inbox.acked == []  # executing: not acked
    rig.executor.finish.set()
    await until(lambda: rig.inbox.acked == [message], "the message to be acked")
    assert acked_when_recorded == [[]]  # recorded while still unacked
    assert [c.result.outcome for c in rig.store.recorded] == [Outcome.SUCCEEDED]
    assert rig.store.events == [("start", "a"), ("record", "a")]
    assert not rig.worker.in_flight
    await rig.stopped()


async def test_a_verdict_waits_through_an_outage_and_is_acked_only_once_recorded() -> None:
    rig = Rig()
    rig.store.complete_outages = 3
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: rig.store.complete_outages == 0, "the outage to be retried through")
    await until(lambda: [m.run_id for m in rig.inbox.acked] == ["a"], "the ack")
    assert [c.run_id for c in rig.store.recorded] == ["a"]
    await rig.stopped()


async def test_a_completion_that_fails_is_never_acked() -> None:
    rig = Rig()
    rig.store.complete_errors["a"] = RuntimeError("bug in complete")
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a"))
    task = rig.start()
    with pytest.raises(ExceptionGroup) as raised:
        await asyncio.wait_for(task, 10)
    assert raised.group_contains(RuntimeError, match="bug in complete")
    assert rig.inbox.acked == []
    assert [m.run_id for m in rig.inbox.termed] == ["a"]  # left to its lease


async def test_a_copy_redelivered_while_the_run_executes_here_is_acked_without_a_second_start() -> (
    None
):
    rig = Rig()
    redeliveries = sample("claimd_redeliveries_total")
    skipped = sample("claimd_deliveries_skipped_total", reason="executing_here")
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: len(rig.executor.calls) == 1, "the run to start")
    rig.seconds.now += 31  # past ack_wait, no in_progress: the broker delivers it again
    await until(lambda: len(rig.inbox.deliveries) == 2, "the redelivery")
    copy = rig.inbox.deliveries[1]
    await until(lambda: copy.settled == ["ack"], "the copy to be acked")
    assert copy.delivery_count == 2
    assert len(rig.store.starts) == 1
    assert rig.executor.calls == [("a", 1)]
    assert sample("claimd_redeliveries_total") == redeliveries + 1
    assert sample("claimd_deliveries_skipped_total", reason="executing_here") == skipped + 1
    rig.executor.finish.set()
    await until(lambda: rig.inbox.deliveries[0].settled == ["ack"], "the first one acked")
    assert len(rig.store.recorded) == 1
    await rig.stopped()


async def test_the_heartbeat_keeps_the_message_in_progress_while_the_run_executes() -> None:
    rig = Rig(heartbeat_interval=timedelta(milliseconds=1))
    rig.inbox.put(dispatch("a"))
    rig.start()
    await until(lambda: rig.store.extend_calls >= 2, "a few heartbeats")
    delivery = rig.inbox.deliveries[0]
    assert delivery.progress_marks >= 1
    assert delivery.settled == []
    await rig.stopped()


async def test_schedule_lag_is_measured_on_the_injected_clock() -> None:
    rig = Rig()
    rig.clock.current = T0 + timedelta(seconds=90)
    before = sample("claimd_start_lag_seconds_sum", claimd_job="lagging")
    rig.executor.finish.set()
    rig.inbox.put(dispatch("a", job="lagging"))
    rig.start()
    await until(lambda: len(rig.inbox.acked) == 1, "the run done")
    assert sample("claimd_start_lag_seconds_sum", claimd_job="lagging") == before + 90
    await rig.stopped()

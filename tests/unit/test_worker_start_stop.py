"""Starts that fail, and the stop, on in-memory ports.

A start that fails in an outage naks its messages and pauses the intake until
the database answers; any other failure naks and raises (a bug, for the
supervisor). At a stop, runs finish within the grace and are recorded; what
outlives it is cancelled, handed back and acked.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from actors.ports import StoreUnavailable
from tests.fakes import dispatch, sample
from tests.unit.worker_rig import Rig, until

pytestmark = pytest.mark.timeout(30)


async def test_a_start_in_an_outage_naks_pauses_the_intake_and_the_redelivery_starts() -> None:
    rig = Rig()
    pauses = sample("claimd_intake_pauses_total", actor="worker", reason="starts")
    rig.store.start_error = StoreUnavailable("start: connection refused")
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: rig.inbox.naked == [message], "the nak")
    await until(
        lambda: sample("claimd_intake_pauses_total", actor="worker", reason="starts") == pauses + 1,
        "the intake paused",
    )
    rig.store.start_error = None  # the database is back (its ping answered all along)
    rig.seconds.now += 1.0  # the nak's delay
    await until(lambda: len(rig.executor.calls) == 1, "the redelivery started")
    assert [d.delivery_count for d in rig.inbox.deliveries] == [1, 2]
    assert len(rig.store.starts) == 2
    await rig.stopped()
    assert rig.inbox.acked == [message]


async def test_a_start_that_fails_for_another_reason_naks_and_raises() -> None:
    rig = Rig()
    rig.store.start_error = RuntimeError("bug in start")
    message = dispatch("a")
    rig.inbox.put(message)
    with pytest.raises(ExceptionGroup) as raised:
        await asyncio.wait_for(rig.start(), 10)
    assert raised.group_contains(RuntimeError, match="bug in start")
    assert rig.inbox.naked == [message]
    assert rig.executor.calls == []


async def test_at_a_stop_runs_that_finish_within_the_grace_are_recorded_and_acked() -> None:
    rig = Rig()
    for run_id in ("a", "b"):
        rig.inbox.put(dispatch(run_id))
    rig.start()
    await until(lambda: len(rig.executor.calls) == 2, "both started")
    rig.stop.set()
    rig.inbox.interrupt()
    rig.executor.finish.set()  # they finish during the drain
    assert rig.task is not None
    await asyncio.wait_for(rig.task, 10)
    assert sorted(m.run_id for m in rig.inbox.acked) == ["a", "b"]
    assert sorted(c.run_id for c in rig.store.recorded) == ["a", "b"]
    assert rig.store.interrupted == []


async def test_at_a_stop_runs_past_the_grace_are_cancelled_handed_back_and_acked() -> None:
    rig = Rig(grace=timedelta(milliseconds=50))
    message = dispatch("a")
    rig.inbox.put(message)
    rig.start()
    await until(lambda: len(rig.executor.calls) == 1, "the run started")
    await rig.stopped(finish=False)  # it never finishes by itself
    assert rig.executor.cancelled == ["a"]
    assert rig.store.interrupted == [("a", 1)]
    assert rig.store.recorded == []
    assert rig.inbox.acked == [message]  # that epoch's message is obsolete
    assert not rig.worker.in_flight


async def test_a_full_worker_fetches_nothing_until_a_slot_frees() -> None:
    rig = Rig(concurrency=2)
    for run_id in ("a", "b", "c"):
        rig.inbox.put(dispatch(run_id))
    rig.start()
    await until(lambda: len(rig.executor.calls) == 2, "two started")
    assert rig.inbox.pending == 1  # the third waits in the inbox, not in the worker
    rig.executor.finish.set()
    await until(lambda: len(rig.inbox.acked) == 3, "all three done")
    await rig.stopped()

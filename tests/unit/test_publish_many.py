"""publish_many: one result per message, in order, whatever each publish's ack does.

A fake JetStream context stands in for nats-py's ``publish_async`` (the real
broker is in tests/integration/test_dispatch.py): it hands out one future per
publish and lets the test answer, fail or ignore each.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import nats.errors
import pytest
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from actors.adapters.nats import JetStreamBroker, decode
from actors.ports import DispatchMessage
from tests.chaos.broken import FailingPublishes

DEPLOYMENT = "prod"


class FakeJetStream:
    """publish_async without a server: every publish is recorded with its future."""

    def __init__(self, answer: Any = None) -> None:
        # answer(index, future): settle the future at once, or leave it (never acked).
        self.answer = answer
        self.published: list[tuple[str, bytes, dict[str, str], str | None]] = []
        self.futures: list[asyncio.Future[api.PubAck]] = []
        self.peak_pending = 0

    async def publish_async(
        self,
        subject: str,
        payload: bytes = b"",
        wait_stall: float | None = None,
        stream: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> asyncio.Future[api.PubAck]:
        future: asyncio.Future[api.PubAck] = asyncio.get_running_loop().create_future()
        self.published.append((subject, payload, dict(headers or {}), stream))
        self.futures.append(future)
        self.peak_pending = max(self.peak_pending, self.publish_async_pending())
        if self.answer is not None:
            self.answer(len(self.futures) - 1, future)
        return future

    def publish_async_pending(self) -> int:
        return sum(1 for f in self.futures if not f.done())

    async def publish_async_completed(self) -> None:
        while self.publish_async_pending():
            await asyncio.sleep(0)


def broker(js: FakeJetStream, **kwargs: Any) -> JetStreamBroker:
    return JetStreamBroker(
        cast(Any, None),
        cast(JetStreamContext, js),
        "CLAIMD_prod",
        "claimd.prod.runs",
        **kwargs,
    )


def messages(n: int) -> list[DispatchMessage]:
    return [
        DispatchMessage(
            run_id=f"0b5c7a52-3f3e-4e0e-9d51-6a1d2c3b4{i:03d}",
            epoch=i + 1,
            job=f"job-{i}",
            scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
            attempt=1,
            deployment=DEPLOYMENT,
        )
        for i in range(n)
    ]


def ack(_: int, future: asyncio.Future[api.PubAck]) -> None:
    future.set_result(api.PubAck(stream="CLAIMD_prod", seq=1))


async def test_every_message_is_published_with_its_dedupe_id_and_acked() -> None:
    js = FakeJetStream(ack)
    batch = messages(5)
    assert await broker(js).publish_many(batch) == [None] * 5
    assert [decode(p, DEPLOYMENT) for _, p, _, _ in js.published] == batch
    assert [h["Nats-Msg-Id"] for _, _, h, _ in js.published] == [m.msg_id for m in batch]
    assert {(s, st) for s, _, _, st in js.published} == {("claimd.prod.runs", "CLAIMD_prod")}


async def test_each_message_gets_its_own_error_in_batch_order() -> None:
    refused = APIError(code=400, description="wrong last sequence")

    def answer(i: int, future: asyncio.Future[api.PubAck]) -> None:
        epoch = decode(js.published[i][1], DEPLOYMENT).epoch  # the message's index + 1
        if epoch == 2:
            future.set_exception(refused)
        elif epoch != 4:  # the fourth is never acked: it times out
            ack(i, future)

    js = FakeJetStream(answer)
    # The harness's fault (installed at start-up): the third publish fails before it is sent.
    b = FailingPublishes(broker(js, publish_timeout=0.05), every=3)
    results = await b.publish_many(messages(5))
    assert results[0] is None
    assert results[4] is None
    assert results[1] is refused
    assert isinstance(results[2], ConnectionError)
    assert isinstance(results[3], nats.errors.TimeoutError)
    assert len(js.published) == 4  # the faulted one never went out
    # The unanswered ack was given up at the deadline: nothing left pending.
    assert js.publish_async_pending() == 0


async def test_a_batch_larger_than_the_window_waits_for_acks_and_all_go_out() -> None:
    js = FakeJetStream()  # acks come later, from the "server" task below

    async def server() -> None:
        answered = 0
        while answered < 10:
            for future in js.futures:
                if not future.done():
                    ack(0, future)
                    answered += 1
            await asyncio.sleep(0)

    serving = asyncio.create_task(server())
    assert await broker(js, publish_window=3).publish_many(messages(10)) == [None] * 10
    await serving
    assert len(js.published) == 10
    assert js.peak_pending <= 3


async def test_a_full_window_that_never_drains_ends_at_the_deadline() -> None:
    js = FakeJetStream()  # nothing is ever acked
    results = await broker(js, publish_window=2, publish_timeout=0.05).publish_many(messages(4))
    assert all(isinstance(r, nats.errors.TimeoutError) for r in results)
    assert len(js.published) == 2  # the others never fitted in the window
    assert js.publish_async_pending() == 0


async def test_cancelled_publish_forgets_its_acks() -> None:
    js = FakeJetStream()
    task = asyncio.create_task(broker(js, publish_timeout=30).publish_many(messages(3)))
    while len(js.published) < 3:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert js.publish_async_pending() == 0

"""The JetStream inbox on a fake pull subscription: what stays inside the adapter.

Poison is terminated and counted, never handed to the worker; empty fetches
lead to a ping, and an unanswered one says the broker is silent; fetches that
keep failing, and a ping answered after silence, bind the consumer anew. The
real consumer (rebinding after the stream was deleted, redelivery counts) is
exercised in tests/integration (test_poison.py, test_outage.py).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from actors.adapters.nats import encode
from actors.adapters.nats_inbox import RESUBSCRIBE_AFTER, JetStreamInbox, PullSubscription
from actors.ports import InboxSilent
from tests.fakes import dispatch, sample


class Msg:
    def __init__(self, data: bytes, delivered: int = 1) -> None:
        self.data = data
        self.metadata = SimpleNamespace(num_delivered=delivered)
        self.replies: list[str] = []

    async def ack(self) -> None:
        self.replies.append("ack")

    async def term(self) -> None:
        self.replies.append("term")


class Sub:
    """Each fetch answers with the next item: a list of messages or an exception."""

    def __init__(self, *answers: list[Msg] | Exception) -> None:
        self.answers = list(answers)

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Any]:
        answer = self.answers.pop(0) if self.answers else TimeoutError()
        if isinstance(answer, Exception):
            raise answer
        return answer


class Broker:
    def __init__(self, sub: Sub) -> None:
        self.sub = sub
        self.up = True
        self.probes = 0
        self.rebinds = 0

    async def probe(self) -> None:
        self.probes += 1
        if not self.up:
            raise ConnectionError("no pong")

    async def rebind(self) -> PullSubscription:
        self.rebinds += 1
        return self.sub


def _inbox(broker: Broker) -> JetStreamInbox:
    return JetStreamInbox(broker.sub, "d", rebind=broker.rebind, probe=broker.probe)


async def test_deliveries_carry_the_decoded_message_and_the_delivery_count() -> None:
    message = dispatch("6f1c0a52-5f3b-4a35-9c3e-1c7d2f5b9a10")
    raw = Msg(encode(message), delivered=3)
    [delivery] = await _inbox(Broker(Sub([raw]))).fetch(10, 1.0)
    assert delivery.message == message
    assert delivery.delivery_count == 3
    await delivery.ack()
    assert raw.replies == ["ack"]


async def test_poison_is_terminated_counted_and_never_handed_out() -> None:
    good = dispatch("6f1c0a52-5f3b-4a35-9c3e-1c7d2f5b9a10")
    other = json.loads(encode(good))
    other["deployment"] = "elsewhere"
    poison = [Msg(b"not json"), Msg(json.dumps(other).encode())]
    before = {
        r: sample("claimd_poison_messages_total", reason=r)
        for r in ("not_json", "other_deployment")
    }
    deliveries = await _inbox(Broker(Sub([*poison, Msg(encode(good))]))).fetch(10, 1.0)
    assert [d.message for d in deliveries] == [good]
    assert [m.replies for m in poison] == [["term"], ["term"]]
    for reason, value in before.items():
        assert sample("claimd_poison_messages_total", reason=reason) == value + 1


async def test_empty_fetches_ask_the_broker_and_an_unanswered_ping_is_silence() -> None:
    broker = Broker(Sub())
    broker.up = False
    inbox = _inbox(broker)
    for _ in range(RESUBSCRIBE_AFTER - 1):
        assert await inbox.fetch(1, 0.01) == []
    assert broker.probes == 0
    with pytest.raises(InboxSilent, match="no pong"):
        await inbox.fetch(1, 0.01)
    assert not await inbox.reconnect()
    assert broker.rebinds == 0
    broker.up = True
    assert await inbox.reconnect()
    assert broker.rebinds == 1  # a broker back from silence may have lost the consumer


async def test_fetches_that_keep_failing_bind_the_consumer_anew() -> None:
    failures = [ConnectionError("stream gone")] * RESUBSCRIBE_AFTER
    broker = Broker(Sub(*failures, []))
    inbox = _inbox(broker)
    for _ in failures:
        with pytest.raises(ConnectionError):
            await inbox.fetch(1, 0.01)
    assert broker.rebinds == 0
    assert await inbox.fetch(1, 0.01) == []
    assert broker.rebinds == 1

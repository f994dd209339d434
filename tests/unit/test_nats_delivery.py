"""The NATS adapter's per-message shortcuts agree with nats-py's own reading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.msg import Msg

from actors.adapters.nats import delivery_count
from actors.adapters.nats.codec import take_waiting_at_once

V1 = "$JS.ACK.CLAIMD_prod.workers.{n}.1042.977.1764590000000000000.12"
V2 = "$JS.ACK.hub.ACCHASH.CLAIMD_prod.workers.{n}.1042.977.1764590000000000000.12.tok"


def message(reply: str) -> Msg:
    return Msg(_client=None, subject="claimd.prod.runs", reply=reply, data=b"{}")  # type: ignore[arg-type]


@pytest.mark.parametrize("form", [V1, V2, V2.removesuffix(".tok")])
@pytest.mark.parametrize("n", [1, 2, 17])
def test_delivery_count_reads_what_the_metadata_says(form: str, n: int) -> None:
    msg = message(form.format(n=n))
    assert delivery_count(msg) == msg.metadata.num_delivered == n


@pytest.mark.parametrize(
    "reply",
    ["", "_INBOX.abc", "$JS.ACK.s.c.x.1.2.3.4", "$JS.ACK.s.c.3.1.2.3.4.5", "$JS.API.a.b.c.d.e.f.g"],
)
def test_anything_else_counts_as_a_first_delivery(reply: str) -> None:
    assert delivery_count(message(reply)) == 1


class FakeSubscription:
    """The parts of nats-py's Subscription that next_msg uses."""

    def __init__(self) -> None:
        self._pending_queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._pending_size = 0
        self._conn: Any = type("Conn", (), {"is_closed": False})()
        self.waited = 0

    async def next_msg(self, timeout: float | None = 1.0) -> Msg:
        self.waited += 1
        msg = await asyncio.wait_for(self._pending_queue.get(), timeout)
        self._pending_size -= len(msg.data)
        self._pending_queue.task_done()
        return msg

    def put(self, msg: Msg) -> None:
        self._pending_queue.put_nowait(msg)
        self._pending_size += len(msg.data)


async def test_a_waiting_message_is_taken_at_once_and_an_empty_queue_waits() -> None:
    sub = FakeSubscription()
    take_waiting_at_once(sub)
    first, second = message(V1.format(n=1)), message(V1.format(n=2))
    sub.put(first)
    sub.put(second)
    assert await sub.next_msg(1) is first
    assert await sub.next_msg(1) is second
    assert (sub.waited, sub._pending_size) == (0, 0)
    with pytest.raises(TimeoutError):
        await sub.next_msg(0.01)  # nothing waiting: nats-py's own wait, and its timeout
    assert sub.waited == 1
    sub.put(first)
    sub._conn.is_closed = True  # a closed connection: nats-py's path says so
    assert await sub.next_msg(1) is first
    assert sub.waited == 2

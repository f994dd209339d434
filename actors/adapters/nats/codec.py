"""The dispatch message on the wire: version 1 JSON, decoded or refused as poison; and read
off a subscription without nats-py's per-message task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from datetime import datetime
from typing import Any, cast

from nats.aio.msg import Msg

from actors.ports import DispatchMessage

MESSAGE_VERSION = 1
# A dispatch message is ~200 bytes; anything far larger is not ours.
MAX_MESSAGE_BYTES = 4096


class PoisonMessage(ValueError):
    """A message on the dispatch subject that is not a dispatch of this deployment."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def encode(message: DispatchMessage) -> bytes:
    body: dict[str, Any] = {
        "v": MESSAGE_VERSION,
        "run_id": message.run_id,
        "epoch": message.epoch,
        "job": message.job,
        "scheduled_at": message.scheduled_at.isoformat(),
        "attempt": message.attempt,
        "deployment": message.deployment,
    }
    if message.due_at is not None:
        # Optional, so version 1 still: an older worker ignores it (starts at
        # once; START_RUNS refuses a run not yet due and the message comes back).
        body["due_at"] = message.due_at.isoformat()
    if message.executor is not None:
        body["executor"] = message.executor  # optional too: a slot when absent
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes, deployment: str) -> DispatchMessage:
    """Parse a dispatch message, or raise PoisonMessage saying why not."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise PoisonMessage("oversized", f"{len(data)} bytes")
    try:
        body: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PoisonMessage("not_json", str(exc)[:100]) from None
    if not isinstance(body, dict) or body.get("v") != MESSAGE_VERSION:
        raise PoisonMessage("wrong_schema", "not a version-1 dispatch object")
    try:
        run_id = str(uuid.UUID(str(body["run_id"])))
        epoch = body["epoch"]
        attempt = body["attempt"]
        # bool is an int to Python; the epoch must fit the bigint column.
        if (
            any(not isinstance(n, int) or isinstance(n, bool) for n in (epoch, attempt))
            or not 1 <= epoch < 2**63
            or not 1 <= attempt < 2**31
        ):
            raise ValueError("epoch and attempt must be positive integers")
        texts = [body["job"], body["scheduled_at"], body["deployment"]]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("job, scheduled_at and deployment must be strings")
        scheduled_at = datetime.fromisoformat(body["scheduled_at"])
        if scheduled_at.utcoffset() is None:
            raise ValueError("scheduled_at must carry a UTC offset")
        due_at = _optional_instant(body, "due_at")
        executor = body.get("executor")
        if executor is not None and not isinstance(executor, str):
            raise ValueError("executor must be a string")
        message = DispatchMessage(
            run_id=run_id,
            epoch=epoch,
            job=body["job"],
            scheduled_at=scheduled_at,
            attempt=attempt,
            deployment=body["deployment"],
            due_at=due_at,
            executor=executor,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise PoisonMessage("wrong_schema", str(exc)[:100]) from None
    if message.deployment != deployment:
        raise PoisonMessage("other_deployment", message.deployment[:64])
    return message


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE = 512


def trace_context_of(msg: Msg) -> tuple[tuple[str, str], ...]:
    """The W3C trace context a dispatch message's headers carry (tracing on), else ().

    A malformed ``traceparent`` is dropped (the run is not refused: the
    context is a courtesy), and ``tracestate`` travels only beside a valid one.
    """
    headers = getattr(msg, "headers", None)
    if not headers:
        return ()
    parent = headers.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.fullmatch(parent):
        return ()
    state = headers.get("tracestate")
    if isinstance(state, str) and state and len(state) <= MAX_TRACESTATE and state.isprintable():
        return (("traceparent", parent), ("tracestate", state))
    return (("traceparent", parent),)


def _optional_instant(body: dict[str, Any], key: str) -> datetime | None:
    """An optional aware ISO 8601 instant of the body, or ValueError."""
    if body.get(key) is None:
        return None
    if not isinstance(body[key], str):
        raise ValueError(f"{key} must be a string")
    value = datetime.fromisoformat(body[key])
    if value.utcoffset() is None:
        raise ValueError(f"{key} must carry a UTC offset")
    return value


def take_waiting_at_once(sub: Any) -> None:
    """Let a fetch take a message already waiting without a task and a timer for it.

    nats-py's fetch reads each message of a batch with ``next_msg``, which
    starts a task (with a uuid for a name) running ``wait_for`` on the
    subscription's queue: two tasks and a timer per message, even when the
    message is already there. Here a waiting message is handed over at once,
    with nats-py's own bookkeeping; only an empty queue waits the nats-py way.
    Left as it is if this nats-py keeps its messages elsewhere.
    """
    queue = getattr(sub, "_pending_queue", None)
    if not isinstance(queue, asyncio.Queue) or not hasattr(sub, "_pending_size"):
        return
    waiting = sub.next_msg

    async def next_msg(timeout: float | None = 1.0) -> Msg:
        if queue.empty() or sub._conn.is_closed:
            return cast(Msg, await waiting(timeout))
        msg = cast(Msg, queue.get_nowait())
        sub._pending_size -= len(msg.data)
        queue.task_done()
        return msg

    sub.next_msg = next_msg


def delivery_count(msg: Msg) -> int:
    """How many times JetStream has delivered this message (1 on first delivery).

    Read from the ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>...``,
    or with domain and account before the stream) rather than through
    ``msg.metadata``, which builds a dataclass and a datetime per message.
    """
    reply = getattr(msg, "reply", None)
    tokens = reply.split(".") if isinstance(reply, str) else []
    if tokens[:2] == ["$JS", "ACK"] and len(tokens) in (9, *range(11, 64)):
        with contextlib.suppress(ValueError):
            return int(tokens[4] if len(tokens) == 9 else tokens[6])
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # noqa: BLE001 - a message without metadata counts as first
        return 1

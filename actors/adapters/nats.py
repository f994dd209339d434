"""NATS JetStream: the dispatch channel (nats-py).

One stream per deployment with work-queue retention; one durable pull
consumer that every worker shares (explicit ack, ack_wait, max_deliver).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NoStreamResponseError, NotFoundError

from actors.ports import DispatchMessage

MESSAGE_VERSION = 1
# A dispatch message is ~200 bytes; anything far larger is not ours.
MAX_MESSAGE_BYTES = 4096
CONSUMER = "workers"


class PoisonMessage(ValueError):
    """A message on the dispatch subject that is not a dispatch of this deployment."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def encode(message: DispatchMessage) -> bytes:
    return json.dumps({
        "v": MESSAGE_VERSION,
        "run_id": message.run_id,
        "epoch": message.epoch,
        "job": message.job,
        "scheduled_at": message.scheduled_at.isoformat(),
        "attempt": message.attempt,
        "deployment": message.deployment,
    }, separators=(",", ":")).encode()


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
        if any(not isinstance(n, int) or isinstance(n, bool) for n in (epoch, attempt)) \
                or not 1 <= epoch < 2**63 or not 1 <= attempt < 2**31:
            raise ValueError("epoch and attempt must be positive integers")
        texts = [body["job"], body["scheduled_at"], body["deployment"]]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("job, scheduled_at and deployment must be strings")
        scheduled_at = datetime.fromisoformat(body["scheduled_at"])
        if scheduled_at.utcoffset() is None:
            raise ValueError("scheduled_at must carry a UTC offset")
        message = DispatchMessage(
            run_id=run_id, epoch=epoch, job=body["job"], scheduled_at=scheduled_at,
            attempt=attempt, deployment=body["deployment"],
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise PoisonMessage("wrong_schema", str(exc)[:100]) from None
    if message.deployment != deployment:
        raise PoisonMessage("other_deployment", message.deployment[:64])
    return message


class PublishFaults:
    """Test-only fault injection for publishes, enabled by environment only.

    ``CLAIMD_FAULT_PUBLISH_FAIL_EVERY=N`` fails every Nth publish. Nothing in
    production sets it; the chaos harness and tests do.
    """

    def __init__(self, every: int = 0) -> None:
        self.every = every
        self._count = 0

    @classmethod
    def from_env(cls) -> PublishFaults:
        return cls(int(os.environ.get("CLAIMD_FAULT_PUBLISH_FAIL_EVERY", "0") or 0))

    def check(self) -> None:
        if self.every <= 0:
            return
        self._count += 1
        if self._count % self.every == 0:
            raise ConnectionError("injected publish failure")


class JetStreamBroker:
    """Broker port on NATS JetStream."""

    def __init__(self, nc: NATS, js: JetStreamContext, stream: str, subject: str,
                 publish_timeout: float = 5.0, faults: PublishFaults | None = None) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.subject = subject
        self.publish_timeout = publish_timeout
        self.faults = faults or PublishFaults.from_env()
        self._stream_settings: tuple[timedelta, timedelta | None] | None = None
        self._consumer_settings: tuple[timedelta, int, int] | None = None

    @classmethod
    async def connect(cls, url: str, stream: str, subject: str, *,
                      name: str = "claimd", tls_ca: str | None = None) -> JetStreamBroker:
        """Connect; ``tls://`` URLs use TLS, verified against ``tls_ca`` when given
        (else the system's trust store). Credentials go in the URL (user:password@)."""
        tls = ssl.create_default_context(cafile=tls_ca) if tls_ca else None
        nc = await nats.connect(
            url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=5, allow_reconnect=True, tls=tls,
        )
        return cls(nc, nc.jetstream(timeout=10), stream, subject)

    async def ensure_stream(self, duplicate_window: timedelta,
                            max_age: timedelta | None = None) -> None:
        """Create or update the stream (idempotent; several replicas may call it).

        ``max_age``: a dispatch older than its run's lease is obsolete (the
        reaper has re-dispatched the run under a new epoch), so messages expire;
        that also clears messages that exhausted max_deliver, which a work-queue
        stream would otherwise keep.
        """
        self._stream_settings = (duplicate_window, max_age)
        config = api.StreamConfig(
            name=self.stream, subjects=[self.subject],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.FILE,
            duplicate_window=duplicate_window.total_seconds(),
            max_age=None if max_age is None else max_age.total_seconds(),
            max_msg_size=MAX_MESSAGE_BYTES * 4,
        )
        try:
            await self.js.stream_info(self.stream)
            await self.js.update_stream(config)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError:
                await self.js.stream_info(self.stream)  # created by another replica

    async def ensure_consumer(self, ack_wait: timedelta, max_deliver: int,
                              max_ack_pending: int) -> None:
        self._consumer_settings = (ack_wait, max_deliver, max_ack_pending)
        config = api.ConsumerConfig(
            durable_name=CONSUMER, ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait.total_seconds(), max_deliver=max_deliver,
            max_ack_pending=max_ack_pending, filter_subject=self.subject,
        )
        await self.js.add_consumer(self.stream, config)

    async def pull_subscription(self) -> JetStreamContext.PullSubscription:
        return await self.js.pull_subscribe_bind(durable=CONSUMER, stream=self.stream)

    async def publish_many(self, messages: Sequence[DispatchMessage]
                           ) -> list[BaseException | None]:
        """Publish all messages with their acks awaited together.

        Returns, per message, None when JetStream acknowledged it or the error.
        """
        async def one(message: DispatchMessage) -> None:
            self.faults.check()
            await self.js.publish(self.subject, encode(message), timeout=self.publish_timeout,
                                  stream=self.stream, headers={"Nats-Msg-Id": message.msg_id})

        results = await asyncio.gather(*(one(m) for m in messages), return_exceptions=True)
        out: list[BaseException | None] = []
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
            out.append(r if isinstance(r, BaseException) else None)
        if self._stream_settings is not None and any(
                isinstance(r, NoStreamResponseError | NotFoundError) for r in out):
            # The stream is gone (a broker recreated without its data): put it
            # back, with the workers' consumer (pull requests name it, so the
            # workers' subscriptions work again); the failed runs go to the
            # compensator and are published again.
            with contextlib.suppress(Exception):
                await self.ensure_stream(*self._stream_settings)
                if self._consumer_settings is not None:
                    await self.ensure_consumer(*self._consumer_settings)
        return out

    async def close(self) -> None:
        """Flush what is buffered (acks are fire-and-forget publishes), then close.

        Not drain(): a pull subscription with a fetch outstanding makes drain
        wait for its full timeout.
        """
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        await self.nc.close()


def delivery_count(msg: Msg) -> int:
    """How many times JetStream has delivered this message (1 on first delivery)."""
    try:
        return int(msg.metadata.num_delivered)
    except Exception:  # noqa: BLE001 - a message without metadata counts as first
        return 1

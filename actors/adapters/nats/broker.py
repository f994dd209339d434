"""The Broker port on JetStream: the stream and consumer kept as the settings say, publishes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    NotFoundError,
)

from actors.adapters.nats.codec import MAX_MESSAGE_BYTES, encode, take_waiting_at_once
from actors.adapters.nats.connection import NATS_HEALTH, ConnectionEvents, answered
from actors.adapters.nats.refusals import answer_refusals, report_publishes
from actors.clocks import Deadline
from actors.domain import DEFAULT_TIMEOUTS, ClaimdError, TimeoutBudget
from actors.observability import get_logger
from actors.ports import DispatchMessage

log = get_logger("nats")
CONSUMER = "workers"
# Publishes in flight on one connection, acks not yet back: above the largest
# claim_batch, so a batch goes out whole. nats-py's own default is 4000.
PUBLISH_WINDOW = 10_000


class StreamSettingsRefused(ClaimdError):
    """The NATS servers refused the stream as the settings describe it (e.g. its replicas)."""


def _stream_changes(existing: api.StreamConfig | None, wanted: api.StreamConfig) -> list[str]:
    """The settings of ``wanted`` that the existing stream does not have."""
    if existing is None:
        return ["config"]

    def norm(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 3)  # durations come back as seconds from nanoseconds
        return 0 if value is None else value

    fields = (
        "subjects",
        "retention",
        "storage",
        "duplicate_window",
        "max_age",
        "max_msg_size",
        "num_replicas",
    )
    return [
        f
        for f in fields
        if norm(getattr(existing, f)) != norm(getattr(wanted, f))
        and not (f == "num_replicas" and (existing.num_replicas or 1) == wanted.num_replicas)
    ]


class JetStreamBroker:
    """Broker port on NATS JetStream."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        stream: str,
        subject: str,
        publish_timeout: float = DEFAULT_TIMEOUTS.publish_timeout.total_seconds(),
        close_timeout: float = DEFAULT_TIMEOUTS.close_timeout.total_seconds(),
        publish_window: int = 4000,
    ) -> None:
        self.nc = nc
        self.js = js
        answer_refusals(js)  # a full stream's "no" is an answer, not a timeout
        self.stream = stream
        self.subject = subject
        self.publish_timeout = publish_timeout
        self.close_timeout = close_timeout
        # The JetStream context's publish_async_max_pending (nats-py's default
        # unless connect() made the context).
        self.publish_window = publish_window
        self._stream_settings: tuple[timedelta, timedelta | None, int] | None = None
        self._consumer_settings: tuple[timedelta, int, int] | None = None

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str],
        stream: str,
        subject: str,
        *,
        name: str = "claimd",
        tls_ca: str | None = None,
        timeouts: TimeoutBudget = DEFAULT_TIMEOUTS,
    ) -> JetStreamBroker:
        """Connect to one server or any of a cluster's (a list, or comma-separated).

        ``tls://`` URLs use TLS, verified against ``tls_ca`` when given (else the
        system's trust store). Credentials go in the URL (user:password@). Pings
        every ``timeouts.ping_interval``: a server that stops answering is
        dropped after ``max_outstanding_pings`` and another (or the same) one
        reconnected, within a fraction of the lease.
        """
        servers = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
        tls = ssl.create_default_context(cafile=tls_ca) if tls_ca else None
        events = ConnectionEvents(servers)
        nc = await nats.connect(
            servers,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=max(1, round(timeouts.connect_timeout.total_seconds())),
            ping_interval=max(1, round(timeouts.ping_interval.total_seconds())),
            max_outstanding_pings=timeouts.max_outstanding_pings,
            allow_reconnect=True,
            tls=tls,
            error_cb=events.error,
            disconnected_cb=events.disconnected,
            reconnected_cb=events.reconnected,
            closed_cb=events.closed,
            discovered_server_cb=events.discovered,
        )
        events.nc = nc
        NATS_HEALTH.reached(server=events.server())
        return cls(
            nc,
            nc.jetstream(
                timeout=timeouts.api_timeout.total_seconds(),
                publish_async_max_pending=PUBLISH_WINDOW,
            ),
            stream,
            subject,
            publish_timeout=timeouts.publish_timeout.total_seconds(),
            close_timeout=timeouts.close_timeout.total_seconds(),
            publish_window=PUBLISH_WINDOW,
        )

    async def ensure_stream(
        self, duplicate_window: timedelta, max_age: timedelta | None = None, replicas: int = 1
    ) -> None:
        """Create or update the stream (idempotent; several replicas may call it).

        ``max_age``: a dispatch older than its run's lease is obsolete (the
        reaper has re-dispatched the run under a new epoch), so messages expire;
        that also clears messages that exhausted max_deliver, which a work-queue
        stream would otherwise keep.

        ``replicas``: the stream's copies in a JetStream cluster. A stream that
        has fewer is scaled up (logged); one that has more is left as it is and
        a warning says so: a replica started with a stale setting must not take
        durability away from the others. A server that cannot hold that many
        copies (not clustered, too few peers) is a StreamSettingsRefused.
        """
        self._stream_settings = (duplicate_window, max_age, replicas)
        await answered("stream", lambda: self._ensure_stream(duplicate_window, max_age, replicas))

    async def _ensure_stream(
        self, duplicate_window: timedelta, max_age: timedelta | None, replicas: int
    ) -> None:
        config = api.StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.FILE,
            duplicate_window=duplicate_window.total_seconds(),
            max_age=None if max_age is None else max_age.total_seconds(),
            max_msg_size=MAX_MESSAGE_BYTES * 4,
            num_replicas=replicas,
        )
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            try:
                await self.js.add_stream(config)
                return
            except APIError as exc:
                info = await self._created_by_another(exc, replicas)
        existing = (info.config.num_replicas or 1) if info.config else 1
        if existing > replicas:
            log.warning(
                "stream has more replicas than stream_replicas; leaving it so",
                stream=self.stream,
                replicas=existing,
                stream_replicas=replicas,
            )
            config.num_replicas = existing
        elif existing < replicas:
            log.warning(
                "scaling the stream up to stream_replicas",
                stream=self.stream,
                replicas=existing,
                stream_replicas=replicas,
            )
        changed = _stream_changes(info.config, config)
        if not changed:
            # Not an update that changes nothing: on a cluster, an update racing
            # another replica's create of the same stream leaves both requests
            # unanswered (seen on nats-server 2.15), and replicas start together.
            return
        log.info("stream settings updated", stream=self.stream, changed=changed)
        try:
            await self.js.update_stream(config)
        except APIError as exc:
            raise self._refused(exc, config.num_replicas or 1) from None

    async def _created_by_another(self, exc: APIError, replicas: int) -> api.StreamInfo:
        try:
            return await self.js.stream_info(self.stream)  # created by another replica
        except NotFoundError:
            raise self._refused(exc, replicas) from None

    def _refused(self, exc: APIError, replicas: int) -> Exception:
        if exc.code == 503:  # JetStream not ready (an election): not a verdict on the settings
            return exc
        hint = (
            (
                "; stream_replicas must not exceed the JetStream servers of the cluster "
                "(1 for a single server)"
            )
            if replicas > 1
            else ""
        )
        return StreamSettingsRefused(
            f"the NATS servers refused stream {self.stream} with {replicas} "
            f"replica(s): {exc.description or exc} (code {exc.err_code}){hint}"
        )

    async def ensure_consumer(
        self, ack_wait: timedelta, max_deliver: int, max_ack_pending: int
    ) -> None:
        self._consumer_settings = (ack_wait, max_deliver, max_ack_pending)
        config = api.ConsumerConfig(
            durable_name=CONSUMER,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait.total_seconds(),
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            filter_subject=self.subject,
        )
        # NotFound too: a stream created a moment ago may not be known to the
        # server that takes the consumer yet.
        await answered(
            "consumer", lambda: self.js.add_consumer(self.stream, config), also=(NotFoundError,)
        )

    async def pull_subscription(self) -> JetStreamContext.PullSubscription:
        psub = await self.js.pull_subscribe_bind(durable=CONSUMER, stream=self.stream)
        take_waiting_at_once(getattr(psub, "_sub", None))
        return psub

    async def probe(self, timeout: float) -> None:
        """A round trip to the server (PING, PONG) within about ``timeout``; raises if none.

        While nats-py reconnects it is not a round trip at all (a flush then
        only writes the buffer), so a connection that is not up fails at once.
        """
        if not self.nc.is_connected:
            raise ConnectionError("not connected to NATS (reconnecting)")
        await self.nc.flush(timeout=max(1, math.ceil(timeout)))

    async def ready(self, timeout: float) -> str:
        """/readyz's verdict: "disconnected" while nats-py reconnects, "ok" once a PING
        got its PONG (the caller's deadline bounds the wait)."""
        if not self.nc.is_connected:
            return "disconnected"
        await self.nc.flush(timeout=math.ceil(timeout))
        return "ok"

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        """Publish all messages pipelined, their acks collected together.

        Returns, per message, None when JetStream acknowledged it or the error.
        Every publish goes out at once with a reply subject under one inbox
        (nats-py's ``publish_async``): no request, timer and task per message.
        The whole batch shares one deadline, the publish timeout; a message
        whose ack has not come by then counts as a timed-out publish.
        """
        deadline = Deadline.within(self.publish_timeout)
        out: list[BaseException | None] = [None] * len(messages)
        acks: dict[asyncio.Future[api.PubAck], int] = {}
        try:
            for i, message in enumerate(messages):
                try:
                    await self._within_window(acks, deadline)
                    acks[await self._publish_async(message)] = i
                except Exception as exc:  # noqa: BLE001 - that message's result
                    out[i] = exc
            if acks:
                await asyncio.wait(acks, timeout=deadline.left())
            for future, i in acks.items():
                if not future.done() or future.cancelled():
                    out[i] = nats.errors.TimeoutError()
                elif (error := future.exception()) is not None:
                    out[i] = error
        finally:
            for future in acks:
                # Unanswered by the deadline (or the call was cancelled): forget
                # the ack, which frees its place in the window.
                future.cancel()
        report_publishes(out)
        if self._stream_settings is not None and any(
            isinstance(r, NoStreamResponseError | NotFoundError) for r in out
        ):
            # The stream is gone (a broker recreated without its data): put it
            # back, with the workers' consumer (pull requests name it, so the
            # workers' subscriptions work again); the failed runs go to the
            # compensator and are published again.
            with contextlib.suppress(Exception):
                duplicate_window, max_age, replicas = self._stream_settings
                await self.ensure_stream(duplicate_window, max_age, replicas)
                if self._consumer_settings is not None:
                    await self.ensure_consumer(*self._consumer_settings)
        return out

    async def _publish_async(self, message: DispatchMessage) -> asyncio.Future[api.PubAck]:
        # Nats-Msg-Id: JetStream drops a second publish of one claim (same run
        # and epoch) within the duplicate window, never a later re-dispatch.
        return await self.js.publish_async(
            self.subject,
            encode(message),
            stream=self.stream,
            headers=(
                {"Nats-Msg-Id": message.msg_id, **dict(message.trace_context)}
                if message.trace_context
                else {"Nats-Msg-Id": message.msg_id}
            ),
        )

    async def _within_window(
        self, acks: dict[asyncio.Future[api.PubAck], int], deadline: Deadline
    ) -> None:
        """Wait, up to the deadline, until one more publish fits under the pending bound.

        nats-py's ``publish_async`` would otherwise wait for a free place
        without any deadline (its own stall timeout costs a task per message).
        """
        while self.js.publish_async_pending() >= self.publish_window:
            left = deadline.left()
            ours = [f for f in acks if not f.done()]
            if left <= 0:
                raise nats.errors.TimeoutError()
            if ours:
                await asyncio.wait(ours, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            else:  # the window is held by another batch's publishes
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.js.publish_async_completed(), left)

    async def close(self) -> None:
        """Flush what is buffered (acks are fire-and-forget publishes), then close.

        Not drain(): a pull subscription with a fetch outstanding makes drain
        wait for its full timeout. Bounded by the close timeout: on a silent
        connection neither the flush nor the close would ever finish.
        """
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=max(1, round(self.close_timeout / 2)))
        try:
            await asyncio.wait_for(self.nc.close(), self.close_timeout)
        except TimeoutError:
            log.warning(
                "nats connection did not close in time; abandoned", waited_s=self.close_timeout
            )

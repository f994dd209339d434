"""NATS JetStream: the dispatch channel (nats-py).

One stream per deployment with work-queue retention; one durable pull
consumer that every worker shares (explicit ack, ack_wait, max_deliver).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from actors.domain import DEFAULT_TIMEOUTS, ClaimdError, TimeoutBudget
from actors.observability import DependencyHealth, get_logger, redact
from actors.ports import DispatchMessage

log = get_logger("nats")
T = TypeVar("T")
NATS_HEALTH = DependencyHealth("nats")

MESSAGE_VERSION = 1
# A dispatch message is ~200 bytes; anything far larger is not ours.
MAX_MESSAGE_BYTES = 4096
CONSUMER = "workers"
# Publishes in flight on one connection, acks not yet back: above the largest
# claim_batch, so a batch goes out whole. nats-py's own default is 4000.
PUBLISH_WINDOW = 10_000


class PoisonMessage(ValueError):
    """A message on the dispatch subject that is not a dispatch of this deployment."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def encode(message: DispatchMessage) -> bytes:
    return json.dumps(
        {
            "v": MESSAGE_VERSION,
            "run_id": message.run_id,
            "epoch": message.epoch,
            "job": message.job,
            "scheduled_at": message.scheduled_at.isoformat(),
            "attempt": message.attempt,
            "deployment": message.deployment,
        },
        separators=(",", ":"),
    ).encode()


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
        message = DispatchMessage(
            run_id=run_id,
            epoch=epoch,
            job=body["job"],
            scheduled_at=scheduled_at,
            attempt=attempt,
            deployment=body["deployment"],
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


class StreamSettingsRefused(ClaimdError):
    """The NATS servers refused the stream as the settings describe it (e.g. its replicas)."""


class _ConnectionEvents:
    """nats-py's connection callbacks as structured log events and the dependency metrics.

    Passing ``error_cb`` also keeps nats-py from logging each error with a
    traceback through the standard library.
    """

    def __init__(self, servers: Sequence[str]) -> None:
        self.servers = [redact(s) for s in servers]
        self.nc: NATS | None = None

    def server(self) -> str:
        url = self.nc.connected_url if self.nc is not None else None
        return redact(url.geturl()) if url is not None else ""

    async def error(self, exc: Exception) -> None:
        # ErrStaleConnection: the server stopped answering pings (a half-open connection).
        # While already unreachable, each failed reconnect attempt is detail, not news.
        say = log.debug if NATS_HEALTH.up is False else log.warning
        say("nats connection error", error=redact(repr(exc)), server=self.server())

    async def disconnected(self) -> None:
        if self.nc is not None and self.nc.is_closed:
            return  # our own close, not a lost connection
        NATS_HEALTH.lost("disconnected", servers=self.servers)

    async def reconnected(self) -> None:
        NATS_HEALTH.reached(server=self.server())

    async def closed(self) -> None:
        log.info("nats connection closed", servers=self.servers)

    async def discovered(self) -> None:
        log.info("nats cluster server discovered", server=self.server())


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


async def _answered(
    what: str,
    request: Callable[[], Awaitable[T]],
    *,
    also: tuple[type[Exception], ...] = (),
    attempts: int = 3,
) -> T:
    """A JetStream API request, made again when the cluster left it unanswered.

    A cluster can drop a request made while it settles: a stream info or
    update racing another replica's create of the stream goes unanswered
    (nats-server 2.15), JetStream answers 503 during an election. Each attempt
    is bounded by the API timeout.
    """
    retried: tuple[type[Exception], ...] = (
        nats.errors.TimeoutError,
        ServiceUnavailableError,
        *also,
    )
    for attempt in range(1, attempts + 1):
        try:
            return await request()
        except retried as exc:
            if attempt == attempts:
                raise
            log.warning(
                "JetStream request unanswered; asking again",
                request=what,
                attempt=attempt,
                error=repr(exc),
            )
            await asyncio.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


class JetStreamBroker:
    """Broker port on NATS JetStream."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        stream: str,
        subject: str,
        publish_timeout: float = DEFAULT_TIMEOUTS.publish_timeout.total_seconds(),
        faults: PublishFaults | None = None,
        close_timeout: float = DEFAULT_TIMEOUTS.close_timeout.total_seconds(),
        publish_window: int = 4000,
    ) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.subject = subject
        self.publish_timeout = publish_timeout
        self.close_timeout = close_timeout
        # The JetStream context's publish_async_max_pending (nats-py's default
        # unless connect() made the context).
        self.publish_window = publish_window
        self.faults = faults or PublishFaults.from_env()
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
        events = _ConnectionEvents(servers)
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
        await _answered("stream", lambda: self._ensure_stream(duplicate_window, max_age, replicas))

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
        await _answered(
            "consumer", lambda: self.js.add_consumer(self.stream, config), also=(NotFoundError,)
        )

    async def pull_subscription(self) -> JetStreamContext.PullSubscription:
        psub = await self.js.pull_subscribe_bind(durable=CONSUMER, stream=self.stream)
        _take_waiting_at_once(getattr(psub, "_sub", None))
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout
        out: list[BaseException | None] = [None] * len(messages)
        acks: dict[asyncio.Future[api.PubAck], int] = {}
        try:
            for i, message in enumerate(messages):
                try:
                    self.faults.check()
                    await self._within_window(acks, deadline)
                    acks[await self._publish_async(message)] = i
                except Exception as exc:  # noqa: BLE001 - that message's result
                    out[i] = exc
            if acks:
                await asyncio.wait(acks, timeout=max(0.0, deadline - loop.time()))
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
            headers={"Nats-Msg-Id": message.msg_id},
        )

    async def _within_window(
        self, acks: dict[asyncio.Future[api.PubAck], int], deadline: float
    ) -> None:
        """Wait, up to the deadline, until one more publish fits under the pending bound.

        nats-py's ``publish_async`` would otherwise wait for a free place
        without any deadline (its own stall timeout costs a task per message).
        """
        loop = asyncio.get_running_loop()
        while self.js.publish_async_pending() >= self.publish_window:
            left = deadline - loop.time()
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


def _take_waiting_at_once(sub: Any) -> None:
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

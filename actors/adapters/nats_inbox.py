"""The inbox port on a JetStream pull consumer: what the worker fetches, decoded.

Everything about the transport stays here: decoding (a message that is not a
dispatch of this deployment is terminated, counted and logged, never handed
to the worker), the delivery count from the message's metadata, and keeping
the consumer bound. An empty fetch is ambiguous (no messages, or a dead
connection): after a few in a row the broker is pinged, and an unanswered
ping is :class:`InboxSilent` for the worker to wait out. Fetches that keep
failing, and a ping answered after such a wait, bind the consumer anew: a
broker recreated without its data has lost the stream and the consumer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from nats.aio.msg import Msg

from actors.adapters.nats import PoisonMessage, decode, delivery_count
from actors.adapters.nats.codec import trace_context_of
from actors.observability import POISON_MESSAGES, get_logger
from actors.pacing import Probe
from actors.ports import DispatchMessage, InboxSilent, settle_quietly

log = get_logger("worker")

# Consecutive failed fetches before binding anew; as many empty ones and the broker is pinged.
RESUBSCRIBE_AFTER = 3
PROBE_TIMEOUT_S = 2.0  # a ping's round trip


class PullSubscription(Protocol):
    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Any]: ...


class JetStreamDelivery:
    """A JetStream message with its decoded dispatch."""

    __slots__ = ("_msg", "message")

    def __init__(self, msg: Msg, message: DispatchMessage) -> None:
        self._msg = msg
        self.message = message

    @property
    def delivery_count(self) -> int:
        return delivery_count(self._msg)

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        await self._msg.nak(delay=delay)

    async def term(self) -> None:
        await self._msg.term()

    async def in_progress(self) -> None:
        await self._msg.in_progress()


class JetStreamInbox:
    """Inbox port on the deployment's durable pull consumer.

    ``subscription``: bound to the consumer. ``rebind``: creates the stream and
    the consumer again if they are gone, and binds anew. ``probe``: a round
    trip to the broker (raises when there is none).
    """

    def __init__(
        self,
        subscription: PullSubscription,
        deployment: str,
        *,
        rebind: Callable[[], Awaitable[PullSubscription]],
        probe: Callable[[], Awaitable[object]],
        probe_timeout: float = PROBE_TIMEOUT_S,
    ) -> None:
        self.subscription = subscription
        self.deployment = deployment
        self._rebind = rebind
        self._probe = Probe(probe, probe_timeout)
        self._empty_fetches = 0
        self._failed_fetches = 0

    async def fetch(self, batch: int, timeout: float) -> list[JetStreamDelivery]:
        if self._failed_fetches >= RESUBSCRIBE_AFTER:
            # The stream or consumer may be gone (a broker recreated without
            # its data): create them again and bind anew.
            await self.resubscribe()
        try:
            messages = await self.subscription.fetch(batch, timeout=timeout)
        except TimeoutError:
            # No message within the timeout: what an idle stream says, and all
            # that a dead connection says too. A few in a row: ask the broker.
            self._empty_fetches += 1
            if self._empty_fetches >= RESUBSCRIBE_AFTER:
                self._empty_fetches = 0
                if not await self._probe():
                    raise InboxSilent(
                        f"no answer to a ping after empty fetches: {self._probe.last_error}"
                    ) from None
            return []
        except Exception:
            self._empty_fetches = 0
            self._failed_fetches += 1
            raise
        self._empty_fetches = 0
        self._failed_fetches = 0
        return [d for d in [await self._decoded(m) for m in messages] if d is not None]

    async def reconnect(self) -> bool:
        if not await self._probe():
            return False
        # Reconnected: bind again (a recreated broker may have lost the consumer).
        await self.resubscribe()
        return True

    async def resubscribe(self) -> None:
        try:
            self.subscription = await self._rebind()
        except Exception as exc:  # noqa: BLE001 - the next failed fetches try again
            log.warning("resubscribe failed", error=repr(exc))
            return
        log.info("resubscribed to the dispatch stream")

    async def _decoded(self, msg: Msg) -> JetStreamDelivery | None:
        try:
            message = decode(msg.data, self.deployment)
            trace = trace_context_of(msg)
            if trace:
                message = replace(message, trace_context=trace)
            return JetStreamDelivery(msg, message)
        except ValueError as exc:
            reason = exc.reason if isinstance(exc, PoisonMessage) else "invalid"
            POISON_MESSAGES.labels(reason=reason).inc()
            log.error("poison message terminated", reason=reason, error=str(exc)[:200])
            await settle_quietly(msg.term())
            return None

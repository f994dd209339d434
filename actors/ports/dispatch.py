"""The dispatch channel's ports: publishing (the dispatcher), consuming (the worker)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from actors.observability import get_logger
from actors.ports.messages import DispatchMessage

log = get_logger("dispatch")


class Broker(Protocol):
    """The dispatch channel (NATS JetStream in production)."""

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        """Publish concurrently; one entry per message, None where the broker acked."""
        ...


class Delivery(Protocol):
    """One dispatch as the worker receives it: the message, already decoded, and its verdicts.

    ``ack``: done with (recorded, or nothing to do). ``nak``: deliver it again
    after ``delay`` seconds. ``term``: never deliver it again. ``in_progress``:
    still being worked on (resets the broker's redelivery timer).
    """

    @property
    def message(self) -> DispatchMessage: ...
    @property
    def delivery_count(self) -> int:
        """How many times this message was delivered, this time included (1 the first time)."""
        ...

    async def ack(self) -> None: ...
    async def nak(self, delay: float | None = None) -> None: ...
    async def term(self) -> None: ...
    async def in_progress(self) -> None: ...


class Inbox(Protocol):
    """The consuming side of the dispatch channel (NATS JetStream in production).

    What is not a dispatch of this deployment never comes out of it (the
    adapter terminates it, counts and logs it); a consumer that disappeared is
    bound again inside it.
    """

    async def fetch(self, batch: int, timeout: float) -> Sequence[Delivery]:
        """Up to ``batch`` deliveries, waiting about ``timeout`` for them; empty if none came.

        Raises InboxSilent when fetches stay empty and the broker does not
        answer (wait in :meth:`reconnect`), and any other error when a fetch
        failed (back off and fetch again).
        """
        ...

    async def reconnect(self) -> bool:
        """After InboxSilent: one round trip to the broker; True once it answered.

        When it answers, the inbox binds its consumer anew (a broker recreated
        without its data has lost it).
        """
        ...


class ReplicaBroker(Broker, Protocol):
    """What a replica asks of its broker besides publishing: probes, readiness, stop."""

    # A publish's deadline, in seconds: also the deadline of the probe that
    # reopens claiming after publishes failed.
    publish_timeout: float

    async def probe(self, timeout: float) -> None:
        """A round trip within about ``timeout``; raises if there is none."""
        ...

    async def ready(self, timeout: float) -> str:
        """/readyz's verdict ("ok", or what is wrong); raises when the round trip fails."""
        ...

    async def close(self) -> None: ...


async def settle_quietly(reply: Awaitable[object]) -> None:
    """A :class:`Delivery`'s ack, nak, term or in_progress, best effort: a lost reply
    means a redelivery, which changes nothing (the store's guards decide)."""
    try:
        await reply
    except Exception as exc:  # noqa: BLE001 - cancellation (a BaseException) still passes
        log.warning("broker reply failed", error=repr(exc))

"""The NATS connection: its events as logs and the dependency gauge; requests asked again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.js.errors import (
    ServiceUnavailableError,
)

from actors.observability import DependencyHealth, get_logger, redact

log = get_logger("nats")
T = TypeVar("T")
NATS_HEALTH = DependencyHealth("nats", writes="publishes")


class ConnectionEvents:
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


async def answered(
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

"""In-memory adapters: the ports without servers, for fast unit tests of the actors.

- ``ManualClock``: a clock that moves only when told (the database's clock of
  the in-memory store, and the replica's own).
- ``InMemoryRunStore`` (actors.testing.memory_store): the RunStore port with
  the SQL's semantics.
- ``InMemoryBroker``: the Broker port; each published message goes to every
  subscribed sink (anything with ``put(message)``, such as the worker's
  in-memory inbox), and publishes can be told to fail.

They prove an actor's decisions, never the distributed behaviour: that is the
integration tests' and the fault harness's job, on real PostgreSQL and NATS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from actors.ports import DispatchMessage
from actors.testing.memory_store import InMemoryRunStore

__all__ = ["InMemoryBroker", "InMemoryRunStore", "ManualClock", "Sink"]


@dataclass
class ManualClock:
    """Time that moves only when a test moves it (``advance``, or ``current`` set).

    A MovingClock: every move calls the callbacks given to ``on_moved``, so that
    what waits for an instant on this clock (a worker holding runs claimed
    ahead) sees the jump at once instead of sleeping out a wait computed before it.
    """

    current: datetime = field(default_factory=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    moved: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name == "current":
            for callback in getattr(self, "moved", ()):
                callback()

    def now(self) -> datetime:
        return self.current

    def on_moved(self, callback: Callable[[], None]) -> None:
        self.moved.append(callback)

    def advance(self, by: timedelta) -> datetime:
        self.current += by
        return self.current

    async def read(self) -> datetime:
        """The DatabaseTime port: the in-memory store's clock is this one."""
        return self.current


class Sink(Protocol):
    """Where the broker hands a published message (a worker's inbox)."""

    def put(self, message: DispatchMessage) -> None: ...


@dataclass
class InMemoryBroker:
    """The Broker port in memory: a publish is acked once every subscribed sink has it.

    Dedupes by message id within the broker's life, as JetStream does within
    its duplicate window: a retried publish of one claim is delivered once, a
    re-dispatch under a new epoch again. ``fail`` decides, per message, the
    error its publish fails with (None: published); ``down`` fails them all,
    and also the probe.
    """

    sinks: list[Sink] = field(default_factory=list)
    fail: Callable[[DispatchMessage], BaseException | None] | None = None
    down: BaseException | None = None
    publish_timeout: float = 1.0
    published: list[DispatchMessage] = field(default_factory=list)
    attempts: int = 0
    closed: bool = False
    _seen: set[str] = field(default_factory=set)

    def subscribe(self, sink: Sink) -> Sink:
        self.sinks.append(sink)
        return sink

    def fail_every(self, n: int) -> None:
        """Fail every ``n``-th publish attempt (counted over the broker's life)."""

        def every(_: DispatchMessage) -> BaseException | None:
            return (
                ConnectionError("publish failed (in-memory fault)")
                if self.attempts % n == 0
                else None
            )

        self.fail = every

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        for message in messages:
            self.attempts += 1
            error = self.down or (self.fail(message) if self.fail is not None else None)
            if error is not None:
                results.append(error)
                continue
            if message.msg_id not in self._seen:
                self._seen.add(message.msg_id)
                self.published.append(message)
                for sink in self.sinks:
                    sink.put(message)
            results.append(None)
        return results

    async def probe(self, timeout: float) -> None:
        """A round trip (PING/PONG): fails while the broker is down."""
        if self.down is not None or self.closed:
            raise ConnectionError("in-memory broker down")

    async def ready(self, timeout: float) -> str:
        await self.probe(timeout)
        return "ok"

    async def close(self) -> None:
        self.closed = True

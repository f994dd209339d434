"""What every scheduling actor is handed: one runtime, made once per replica.

- ``database``: the one clock, PostgreSQL's, as this replica estimates it
  (actors.scheduling.database_clock): ``read()`` is a round trip, ``now()`` the
  estimate between them. Every decision about time is made on it.
- ``monotonic``: the clock of local timers (how long a pause lasted, how often a
  side task runs), never compared with the database's.
- ``logger(actor)``: the actor's structured logger.

A replica makes its runtime in actors/replica/wiring.py and hands the same one to
every actor it starts. ``Runtime.local()`` is a runtime on this host's clocks alone,
for a test or a tool that has no database.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from actors.observability import get_logger


class DatabaseClockLike(Protocol):
    """The database's clock: one round trip, and the estimate between round trips."""

    async def read(self) -> datetime: ...
    def now(self) -> datetime: ...


class _HostClock:
    """This host's wall clock standing in for the database's (``Runtime.local``)."""

    async def read(self) -> datetime:
        return self.now()

    def now(self) -> datetime:
        return datetime.now(UTC)


@dataclass(frozen=True)
class Runtime:
    database: DatabaseClockLike
    monotonic: Callable[[], float] = field(default=time.monotonic)

    @classmethod
    def local(cls) -> Runtime:
        """The host's clocks alone: for a test or a tool without a database."""
        return cls(_HostClock())

    def logger(self, actor: str) -> Any:
        """The logger an actor writes to (structlog, named by the actor)."""
        return get_logger(actor)

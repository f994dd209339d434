"""Is this replica reaching PostgreSQL and NATS: each dependency's state, its gauges and log lines.

One :class:`DependencyHealth` per dependency, reported to by its adapter on
every call; an outage begins once and ends once.
"""

from __future__ import annotations

import enum
from typing import Any

from prometheus_client import Counter, Gauge

from actors.observability.logs import get_logger, redact

DEPENDENCIES = ("postgres", "nats")

DEPENDENCY_UP = Gauge(
    "claimd_dependency_up",
    "1 while this replica reaches the dependency (it answers, if only reads), 0 while not",
    ["dependency"],
)
DEPENDENCY_WRITABLE = Gauge(
    "claimd_dependency_writable",
    "1 while the dependency accepts this replica's writes (PostgreSQL) or publishes (NATS)",
    ["dependency"],
)
DEPENDENCY_OUTAGES = Counter(
    "claimd_dependency_outages_total",
    "Outages of a dependency as this replica saw them, counted when one begins, by kind",
    ["dependency", "kind"],
)
RECONNECTS = Counter(
    "claimd_reconnects_total",
    "Connections to a dependency restored after it was unreachable",
    ["dependency"],
)


class DependencyState(enum.StrEnum):
    """What a dependency does for this replica now; the two outage kinds are labels too."""

    UP = "up"
    UNREACHABLE = "unreachable"  # no answer: refused, reset or silent connections
    WRITES_REFUSED = "writes_refused"  # answers reads, refuses writes (read-only, stream full)


OUTAGE_KINDS = (DependencyState.UNREACHABLE, DependencyState.WRITES_REFUSED)


class DependencyHealth:
    """The state of one dependency: an outage begins once and ends once, however many
    calls fail inside it (a log line, a count and the gauges on each change only).

    The adapters report every call: ``lost`` for a failure that means the server
    is unreachable, ``refused`` for a write it answered with a refusal (a
    read-only database, a full stream), ``reached`` for any answer and ``wrote``
    for an accepted write. A read answered ends an unreachable outage, never a
    writes-refused one (reads are what a read-only server still answers); only
    an accepted write ends that. ``writes`` names what the dependency's writes
    are, for the log lines.
    """

    def __init__(self, dependency: str, writes: str = "writes") -> None:
        self.dependency = dependency
        self.writes = writes
        self.state: DependencyState | None = None  # None: never reached yet
        self.reason = ""
        self._log = get_logger(dependency)

    @property
    def up(self) -> bool | None:
        """Whether it answers (None before the first answer)."""
        return None if self.state is None else self.state is not DependencyState.UNREACHABLE

    def reached(self, **fields: Any) -> None:
        """A call was answered (a read, a ping)."""
        if self.state in (None, DependencyState.UNREACHABLE):
            self._become(DependencyState.UP, "", fields)

    def wrote(self, **fields: Any) -> None:
        """A write was accepted: whatever outage there was is over."""
        self._become(DependencyState.UP, "", fields)

    def lost(self, reason: str, **fields: Any) -> None:
        """A call failed in a way that means the server is not reachable."""
        self._become(DependencyState.UNREACHABLE, reason, fields)

    def refused(self, reason: str, **fields: Any) -> None:
        """The server answered a write with a refusal that will last (not about the data)."""
        self._become(DependencyState.WRITES_REFUSED, reason, fields)

    def _become(self, state: DependencyState, reason: str, fields: dict[str, Any]) -> None:
        before = self.state
        if before is state:
            return
        self.state = state
        self.reason = redact(reason)
        name = self.dependency
        if before in OUTAGE_KINDS:
            self._ended(before, fields)
        if state in OUTAGE_KINDS:
            DEPENDENCY_OUTAGES.labels(name, state.value).inc()
            event = (
                f"{name} unreachable"
                if state is DependencyState.UNREACHABLE
                else f"{name} refuses {self.writes}"
            )
            self._log.warning(
                event, dependency=name, kind=state.value, reason=self.reason, **fields
            )
        DEPENDENCY_UP.labels(name).set(0 if state is DependencyState.UNREACHABLE else 1)
        DEPENDENCY_WRITABLE.labels(name).set(1 if state is DependencyState.UP else 0)

    def _ended(self, kind: DependencyState, fields: dict[str, Any]) -> None:
        # A warning like the outage it ends: a log read at WARNING shows both.
        name = self.dependency
        if kind is DependencyState.UNREACHABLE:
            RECONNECTS.labels(name).inc()
            self._log.warning(f"{name} reachable again", dependency=name, kind=kind.value, **fields)
        else:
            self._log.warning(
                f"{name} accepts {self.writes} again", dependency=name, kind=kind.value, **fields
            )


def init_dependency_series() -> None:
    """Each dependency's series at zero (not reached) until its first connection."""
    for dependency in DEPENDENCIES:
        RECONNECTS.labels(dependency)
        DEPENDENCY_UP.labels(dependency)
        DEPENDENCY_WRITABLE.labels(dependency)
        for kind in OUTAGE_KINDS:
            DEPENDENCY_OUTAGES.labels(dependency, kind.value)

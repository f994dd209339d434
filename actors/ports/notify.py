"""The notification sender's ports: the outbox it claims from, and the sinks it sends to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from actors.domain.notify import Notification, NotifyPolicy, Sink


@dataclass(frozen=True)
class SendResult:
    """What one attempt to send got: delivered or not, the sink's status and reply."""

    delivered: bool
    status: int | None = None
    reply: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class OutboxFigures:
    """The cluster's outbox: notifications not yet sent, and the age of the oldest."""

    pending: int
    oldest_s: float
    dead: int


@dataclass(frozen=True)
class NotificationRecord:
    """One notification as `claimd notifications` shows it, attempts included."""

    id: int
    created_at: datetime
    job: str
    run_id: str
    event: str
    sink: str
    state: str
    attempts: int
    sent_at: datetime | None
    due_at: datetime
    last_error: str | None
    attempt_log: tuple[dict[str, Any], ...]


class NotificationStore(Protocol):
    """The outbox (PostgreSQL in production)."""

    async def sync_policies(self, policies: Sequence[NotifyPolicy]) -> None:
        """The jobs' policies as this replica's config says them."""
        ...

    async def judge_verdicts(self, limit: int) -> int:
        """The failed and succeeded verdicts noted since, judged into outbox rows."""
        ...

    async def scan_missed(self, lookback: timedelta) -> int:
        """missed rows for instants whose deadline passed with no success; how many new."""
        ...

    async def scan_too_long(self) -> int:
        """too_long rows for runs still running past their bound; how many new."""
        ...

    async def recover_expired(self, max_attempts: int) -> int:
        """Rows whose sender's lease expired: back to pending, their attempt lost."""
        ...

    async def claim(self, sender: str, limit: int, lease: timedelta) -> list[Notification]:
        """A disjoint batch of due rows, leased to ``sender``, each attempt opened."""
        ...

    async def record(
        self,
        sender: str,
        notification: Notification,
        result: SendResult,
        retry_in: timedelta,
        max_attempts: int,
    ) -> str | None:
        """The attempt's answer; the row's new state, or None if the lease was lost."""
        ...

    async def figures(self) -> OutboxFigures: ...

    async def list(self, job: str | None, limit: int) -> list[NotificationRecord]: ...


class SinkSender(Protocol):
    """Sends one notification to one sink; never raises for the sink's own failure."""

    async def send(self, sink: Sink, notification: Notification, timeout: float) -> SendResult: ...

    async def close(self) -> None: ...

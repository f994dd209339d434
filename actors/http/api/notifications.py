"""GET /api/notifications: the outbox as `claimd notifications` shows it."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

from actors.http.api.reading import answer, query_of
from actors.http.openapi.notifications import Notifications, NotificationsQuery
from actors.operator import Unavailable
from actors.ports.notify import NotificationRecord


class NotificationReader(Protocol):
    async def list(self, job: str | None, limit: int) -> list[NotificationRecord]: ...


def _utc(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


def _item(record: NotificationRecord) -> dict[str, Any]:
    item = {key: _utc(value) for key, value in asdict(record).items()}
    item["attempt_log"] = list(record.attempt_log)
    return item


async def list_notifications(
    request: web.Request, reader: NotificationReader | None
) -> web.Response:
    query = query_of(request, NotificationsQuery)
    if reader is None:
        raise Unavailable("not connected to PostgreSQL yet; try again")
    records = await reader.list(query.job, query.limit)
    return answer(Notifications, [_item(r) for r in records])

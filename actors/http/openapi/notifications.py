"""The notifications' request and answer models (GET /api/notifications; docs/notifications.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from actors.http.openapi.fields import UtcTime, Uuid
from actors.http.openapi.requests import JobName, PageSize


class NotificationsQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    job: JobName | None = Field(None, description="only this job's notifications")
    limit: PageSize = Field(20, description="how many, newest first")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NotificationAttempt(_Answer):
    attempt: int
    started_at: UtcTime
    finished_at: UtcTime | None
    outcome: Literal["sending", "delivered", "failed", "lost"]
    status: int | None = Field(description="the HTTP status or SMTP reply code")
    reply: str | None
    error: str | None
    sender: str = Field(description="the replica that sent it")


class NotificationItem(_Answer):
    id: int
    created_at: UtcTime
    job: str
    run_id: Uuid
    event: Literal["failed", "recovered", "missed", "too_long"]
    sink: str
    state: Literal["pending", "sending", "sent", "dead"]
    attempts: int
    sent_at: UtcTime | None
    due_at: UtcTime = Field(description="when it is (or was) next tried")
    last_error: str | None
    attempt_log: list[NotificationAttempt]


class Notifications(RootModel[list[NotificationItem]]):
    pass

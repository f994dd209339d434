"""Notifications: the events, the sinks, a job's policy, what a sink is sent and its signature.

Pure: the sinks are declared here as data; sending is the adapters' work
(``actors.adapters.notify_senders``), the outbox's rules are SQL's
(``sql/0016_notifications.sql``, ``statements/notify.py``).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


class NotifyEvent(enum.StrEnum):
    """What a notification tells."""

    FAILED = "failed"  # a run has no attempt left
    RECOVERED = "recovered"  # the first success after a notified failure
    MISSED = "missed"  # an instant with no success ``deadline`` after it
    TOO_LONG = "too_long"  # a run still running past its bound


ALL_EVENTS = tuple(NotifyEvent)
# What a job notifies when it does not say: too_long needs a bound of its own.
DEFAULT_EVENTS = (NotifyEvent.FAILED, NotifyEvent.RECOVERED, NotifyEvent.MISSED)


@dataclass(frozen=True)
class WebhookSink:
    """A JSON POST signed with HMAC-SHA256 (see :func:`sign`)."""

    name: str
    url: str
    secret_env: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SlackSink:
    """A Slack-compatible incoming webhook: ``{"text": ...}``; the URL is the secret."""

    name: str
    url: str | None = None
    url_env: str | None = None


@dataclass(frozen=True)
class SmtpSink:
    """An e-mail over SMTP (STARTTLS or TLS from the start), login from the environment."""

    name: str
    host: str
    port: int
    sender: str
    to: tuple[str, ...]
    starttls: bool = False
    tls: bool = False
    user: str | None = None
    password_env: str | None = None


Sink = WebhookSink | SlackSink | SmtpSink


@dataclass(frozen=True)
class NotifyPolicy:
    """One job's notifications, as its replicas store it for the database to apply."""

    job: str
    sinks: tuple[str, ...]
    events: tuple[NotifyEvent, ...] = DEFAULT_EVENTS
    failure_tolerance: int = 1
    realert: timedelta | None = None
    deadline: timedelta | None = None
    too_long: timedelta | None = None


@dataclass(frozen=True)
class Streak:
    """A job's failing streak: failures in a row, and whether ``failed`` was sent for it."""

    consecutive_failures: int = 0
    alerted: bool = False
    last_alert_at: datetime | None = None


def judge_verdict(
    policy: NotifyPolicy, streak: Streak, failed: bool, now: datetime
) -> tuple[Streak, NotifyEvent | None]:
    """The job's streak after a run failed for good (``failed``) or succeeded, and the
    event it owes, if any: ``failed`` from the ``failure_tolerance``-th failure in a
    row, once per streak or again each ``realert``; ``recovered`` on the first
    success after a ``failed`` was sent."""
    if not failed:
        owed = (
            NotifyEvent.RECOVERED
            if streak.alerted and NotifyEvent.RECOVERED in policy.events
            else None
        )
        return Streak(), owed
    count = streak.consecutive_failures + 1
    realert_due = (
        policy.realert is not None
        and streak.last_alert_at is not None
        and now - streak.last_alert_at >= policy.realert
    )
    if (
        NotifyEvent.FAILED in policy.events
        and count >= policy.failure_tolerance
        and (not streak.alerted or realert_due)
    ):
        return Streak(count, True, now), NotifyEvent.FAILED
    return Streak(count, streak.alerted, streak.last_alert_at), None


@dataclass(frozen=True)
class Notification:
    """One outbox row as a sender claimed it, with the run it is about."""

    id: int
    run_id: str
    job: str
    event: NotifyEvent
    sink: str
    attempt: int
    claim_epoch: int
    scheduled_at: datetime
    run_state: str
    run_attempt: int
    outcome: str | None = None
    error: str | None = None
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def delivery_id(self) -> str:
        """Stable across retries and senders: the receiver's key to drop a duplicate."""
        return f"{self.run_id}:{self.event.value}"

    def payload(self) -> dict[str, Any]:
        """The JSON body of a webhook."""

        def iso(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "delivery_id": self.delivery_id,
            "event": self.event.value,
            "job": self.job,
            "run_id": self.run_id,
            "scheduled_at": iso(self.scheduled_at),
            "state": self.run_state,
            "attempt": self.run_attempt,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
        }

    def summary(self) -> str:
        """One line for Slack and a mail's subject."""
        words = {
            NotifyEvent.FAILED: "failed",
            NotifyEvent.RECOVERED: "recovered",
            NotifyEvent.MISSED: "missed its deadline",
            NotifyEvent.TOO_LONG: "is running too long",
        }[self.event]
        return f"claimd: job {self.job} {words} (run of {self.scheduled_at.isoformat()})"

    def text(self) -> str:
        """The body of a mail (and the detail under Slack's line)."""
        lines = [self.summary(), ""]
        for key, value in self.payload().items():
            if value is not None:
                lines.append(f"{key}: {value}")
        return "\n".join(lines)


SIGNATURE_HEADER = "X-Claimd-Signature"
TIMESTAMP_HEADER = "X-Claimd-Timestamp"
EVENT_HEADER = "X-Claimd-Event"
DELIVERY_HEADER = "X-Claimd-Delivery"


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The exact bytes sent and signed."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 over ``"<timestamp>." + body``.

    The timestamp is signed with the body (and sent in its own header) so a
    receiver refuses a replayed request older than its tolerance.
    """
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver does (and our tests): constant-time comparison."""
    try:
        expected = sign(secret, int(timestamp), body)
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature)


def retry_delay(attempt: int, initial: timedelta, maximum: timedelta) -> timedelta:
    """Exponential backoff after the ``attempt``-th failed send (1-based)."""
    return min(maximum, initial * (2 ** max(0, attempt - 1)))

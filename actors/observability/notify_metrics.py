"""The notification outbox's metrics (the sender: actors/scheduling/notifier.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

NOTIFY_OUTCOMES = ("delivered", "failed", "fenced")
NOTIFY_EVENTS = ("failed", "recovered", "missed", "too_long")

NOTIFICATIONS_SENT = Counter(
    "claimd_notifications_sent_total",
    "Attempts to send a notification by this replica, by sink, event and outcome "
    "(fenced: answered after its lease was recovered by another sender)",
    ["sink", "event", "outcome"],
)
# Cluster-wide (the outbox is shared): every replica's sender reads the same figures.
_CLUSTER = "; scope=cluster: read from the database, aggregate with max(), never sum()"
NOTIFICATIONS_PENDING = Gauge(
    "claimd_notifications_pending",
    "Notifications not yet sent (pending or being sent)" + _CLUSTER,
)
NOTIFICATIONS_OLDEST_PENDING = Gauge(
    "claimd_notifications_oldest_pending_seconds",
    "Age of the oldest notification not yet sent (0: none)" + _CLUSTER,
)
NOTIFICATIONS_DEAD = Gauge(
    "claimd_notifications_dead",
    "Notifications given up after their last attempt" + _CLUSTER,
)


def init_notify_series(sinks: list[str]) -> None:
    """Every (sink, event, outcome) series at zero, for the sinks of the config."""
    for sink in sinks:
        for event in NOTIFY_EVENTS:
            for outcome in NOTIFY_OUTCOMES:
                NOTIFICATIONS_SENT.labels(sink, event, outcome)

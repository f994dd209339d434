"""The lease invariant: the reaper must never cause the duplicates it repairs.

``lease > publish + queue_wait + ack_wait x (max_deliver - 1) + execution + complete``

Execution is covered by heartbeats and queue wait by the claimer's bound; what
settings alone must guarantee is that a run's lease outlives every redelivery
the broker may still make of its message, with a safety factor of 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from actors.domain.durations import format_duration
from actors.domain.errors import LeaseInvariantViolated

SAFETY_FACTOR = 3


@dataclass(frozen=True)
class LeaseSettings:
    """The three settings the invariant relates."""

    lease: timedelta
    ack_wait: timedelta
    max_deliver: int

    def redelivery_span(self) -> timedelta:
        """How long the broker may keep redelivering one message."""
        return self.ack_wait * max(0, self.max_deliver - 1)

    def minimum_lease(self) -> timedelta:
        return self.redelivery_span() * SAFETY_FACTOR

    def heartbeat_interval(self) -> timedelta:
        """Often enough to keep both the lease and the broker's ack_wait alive."""
        return min(self.lease / 4, self.ack_wait / 2)


def check_lease_invariant(settings: LeaseSettings) -> None:
    """Refuse settings that let a lease expire while the broker may still deliver."""
    if settings.max_deliver < 1:
        raise LeaseInvariantViolated(f"max_deliver must be at least 1, got {settings.max_deliver}")
    if settings.ack_wait <= timedelta(0) or settings.lease <= timedelta(0):
        raise LeaseInvariantViolated("lease and ack_wait must be greater than zero")
    minimum = settings.minimum_lease()
    if settings.lease <= minimum:
        raise LeaseInvariantViolated(
            "lease is inside the danger zone: lease must be greater than "
            f"ack_wait x (max_deliver - 1) x {SAFETY_FACTOR} = "
            f"{format_duration(settings.ack_wait)} x {settings.max_deliver - 1} x "
            f"{SAFETY_FACTOR} = {format_duration(minimum)}, "
            f"but lease = {format_duration(settings.lease)}. Raise lease, or lower "
            "ack_wait or max_deliver."
        )


DEFAULT_LEASE = LeaseSettings(
    lease=timedelta(seconds=120), ack_wait=timedelta(seconds=5), max_deliver=5
)
# The shipped defaults are checked when the module is imported: a default
# that breaks the invariant cannot ship.
check_lease_invariant(DEFAULT_LEASE)

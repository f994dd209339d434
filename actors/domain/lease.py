"""The lease invariant: the reaper must never cause the duplicates it repairs.

``lease > publish + queue_wait + hold + ack_wait x (max_deliver - 1) + execution + complete``

Execution is covered by heartbeats and queue wait by the claimer's bound; what
settings alone must guarantee is that a run's lease outlives every redelivery
the broker may still make of its message, with a safety factor of 3, and that
the deadlines of the calls around it (publish, one database call) fit too:
:class:`TimeoutBudget` derives every deadline from the lease, and
:func:`check_timeout_budget` refuses settings whose deadlines do not fit.

The hold: a run may be claimed up to ``claim_ahead`` before it is due, and the
worker that receives it holds it until its instant before starting it. The
claim's lease (set at the claim, ``now() + lease``) is what covers the hold; the
heartbeat does not extend a held run (it extends running rows only), and the
start sets a fresh lease. So ``claim_ahead`` is one more term of the sum the
lease must exceed, and it is bounded by :meth:`LeaseSettings.max_hold`, an
eighth of the lease: a held message is kept from redelivery by ``in_progress``
every ``ack_wait / 3`` (and once more just before its release), so the hold is no longer bound to
``ack_wait``, and it stays a small term of the lease. A hold that overruns
anyway (a frozen worker) cannot double a run: its lease lapses, the reaper
hands the run a new epoch, and the held message's start is refused by the
epoch guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from actors.domain import defaults
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

    def max_hold(self) -> timedelta:
        """The longest a worker holds a run claimed ahead before starting it.

        An eighth of the lease (15 s at the default 120 s): the claim's lease
        covers the hold with room for every other term of the invariant. The
        held message is kept from redelivery by ``in_progress`` every
        ``ack_wait / 3`` (see ``actors/worker/claimed_ahead.py``). ``claim_ahead`` may not
        exceed it.
        """
        return self.lease / 8

    def heartbeat_interval(self) -> timedelta:
        """Often enough to keep both the lease and the broker's ack_wait alive."""
        return min(self.lease / 4, self.ack_wait / 2)

    def keep_held_alive(self) -> timedelta:
        """How often a worker tells the broker a delivery it holds (claimed ahead, not yet
        due) is still in progress: three times per ack_wait, so one lost beat is not a
        redelivery."""
        return self.ack_wait / 3

    def stream_max_age(self, duplicate_window: timedelta) -> timedelta:
        """How long the stream keeps a message: two leases (a message outlives every claim
        that can still start it), and never less than the duplicate window."""
        return max(self.lease * 2, duplicate_window)


def stall_after(lease: timedelta) -> timedelta:
    """A database call of the worker unanswered this long is failing: a quarter of the
    lease (a second at least), while the leases it would extend still run."""
    return max(lease / 4, timedelta(seconds=1))


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
    lease=defaults.LEASE, ack_wait=defaults.ACK_WAIT, max_deliver=defaults.MAX_DELIVER
)
# The shipped defaults are checked when the module is imported: a default
# that breaks the invariant cannot ship.
check_lease_invariant(DEFAULT_LEASE)


# --- the timeout budget -------------------------------------------------------
#
# Every call to the database or the broker has a deadline, and the deadlines
# come from the lease: a connection that goes silent must fail a call, not
# hang the actor that made it (and its heartbeats) for minutes. Fractions of
# the lease, capped where a longer wait buys nothing, with a floor below which
# a busy but healthy server would time out.

_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)


def _clamp(value: timedelta, floor: timedelta, cap: timedelta) -> timedelta:
    # Whole milliseconds: the numbers print exactly and round-trip through the config.
    return max(floor, min(cap, _MS * round(value / _MS)))


def _whole_seconds(value: timedelta) -> timedelta:
    # TCP keepalive and nats-py pings take whole seconds.
    return _SECOND * max(1, -(-value // _SECOND))


@dataclass(frozen=True)
class TimeoutBudget:
    """The deadlines of one replica, all derived from the lease (see :meth:`from_settings`).

    What each bounds:

    - ``statement_timeout``: one database statement (asyncpg's command timeout).
    - ``acquire_timeout``: waiting for a pooled connection (or connecting one),
      and again returning it after a statement (asyncpg waits for the cancel of
      a timed-out statement there).
    - ``connect_timeout``: one connection attempt to one database host or NATS server.
    - ``publish_timeout``: JetStream's acknowledgement of one publish.
    - ``close_timeout``: closing the pool and the NATS connection when stopping;
      what is left then is terminated.
    - ``api_timeout``: one JetStream API request (stream and consumer info,
      create, update), which a cluster answers only once its leaders agree.
    - ``ping_interval`` x (``max_outstanding_pings`` + 1): a NATS connection
      that stops answering is dropped and reconnected.
    - ``keepalive_idle`` + ``keepalive_interval`` x ``keepalive_count``: a
      database connection that stops answering is dropped (by the client and
      by the server, which frees its locks).
    """

    lease: timedelta
    ack_wait: timedelta
    max_deliver: int
    statement_timeout: timedelta
    acquire_timeout: timedelta
    connect_timeout: timedelta
    publish_timeout: timedelta
    close_timeout: timedelta
    api_timeout: timedelta
    ping_interval: timedelta
    max_outstanding_pings: int
    keepalive_idle: timedelta
    keepalive_interval: timedelta
    keepalive_count: int
    # How long before its instant a run may be claimed (and then held by the worker).
    claim_ahead: timedelta = timedelta(0)

    @classmethod
    def from_settings(
        cls,
        lease: timedelta,
        ack_wait: timedelta,
        max_deliver: int,
        *,
        statement_timeout: timedelta | None = None,
        publish_timeout: timedelta | None = None,
        claim_ahead: timedelta = timedelta(0),
    ) -> TimeoutBudget:
        """Derive every deadline from the lease; the two the invariant sums may be set."""
        statement = statement_timeout or _clamp(lease / 8, 500 * _MS, 30 * _SECOND)
        keepalive = _whole_seconds(min(30 * _SECOND, lease / 16))
        return cls(
            lease=lease,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            statement_timeout=statement,
            acquire_timeout=max(250 * _MS, _MS * round(statement / 2 / _MS)),
            connect_timeout=_clamp(lease / 8, _SECOND, 10 * _SECOND),
            publish_timeout=publish_timeout or _clamp(lease / 8, 250 * _MS, 5 * _SECOND),
            close_timeout=_clamp(lease / 8, _SECOND, 10 * _SECOND),
            api_timeout=_clamp(lease / 4, 5 * _SECOND, 10 * _SECOND),
            ping_interval=_whole_seconds(min(20 * _SECOND, lease / 12)),
            max_outstanding_pings=2,
            keepalive_idle=keepalive,
            keepalive_interval=keepalive,
            keepalive_count=3,
            claim_ahead=claim_ahead,
        )

    @property
    def lease_settings(self) -> LeaseSettings:
        return LeaseSettings(lease=self.lease, ack_wait=self.ack_wait, max_deliver=self.max_deliver)

    def database_call(self) -> timedelta:
        """The longest one database call can take: acquire + statement + release."""
        return self.acquire_timeout + self.statement_timeout + self.acquire_timeout

    def required_lease(self) -> timedelta:
        """publish + hold + ack_wait x (max_deliver - 1) + complete; the lease must exceed it.

        Queue wait is bounded by ``max_claimed`` (a count, not a duration) and
        execution by heartbeats; the factor of 3 on the redelivery span leaves
        them room. The hold is at most ``claim_ahead``.
        """
        return (
            self.publish_timeout
            + self.claim_ahead
            + self.lease_settings.redelivery_span()
            + self.database_call()
        )

    def nats_dead_after(self) -> timedelta:
        """A NATS connection that stops answering is dropped within this."""
        return self.ping_interval * (self.max_outstanding_pings + 1)

    def database_dead_after(self) -> timedelta:
        """An idle database connection that stops answering is dropped within this."""
        return self.keepalive_idle + self.keepalive_interval * self.keepalive_count

    def claim_ahead_that_fits(self) -> timedelta:
        """The default claim_ahead where it fits these deadlines, else what does: at most
        an eighth of the lease (what a worker may hold) and half of what the lease leaves
        over the other terms of its invariant (this budget's claim_ahead not counted)."""
        spare = self.lease - (self.required_lease() - self.claim_ahead)
        fits = _MS * max(0, int(spare / 2 / _MS))
        return min(defaults.CLAIM_AHEAD, self.lease_settings.max_hold(), fits)

    def invariant_terms(self) -> str:
        """The sum the lease must exceed, with its numbers."""
        f = format_duration
        hold, held = (
            ("claim_ahead + ", f"{f(self.claim_ahead)} + ") if self.claim_ahead else ("", "")
        )
        return (
            f"publish_timeout + {hold}ack_wait x (max_deliver - 1) + database call "
            f"(acquire + statement_timeout + release) = {f(self.publish_timeout)} + {held}"
            f"{f(self.ack_wait)} x {self.max_deliver - 1} + ({f(self.acquire_timeout)} + "
            f"{f(self.statement_timeout)} + {f(self.acquire_timeout)}) = "
            f"{f(self.required_lease())}"
        )

    def describe(self) -> list[str]:
        """A few lines for ``claimd check-config``."""
        f = format_duration
        return [
            f"timeouts (from lease {f(self.lease)}): statement {f(self.statement_timeout)}, "
            f"acquire/release {f(self.acquire_timeout)}, connect {f(self.connect_timeout)}, "
            f"publish {f(self.publish_timeout)}, close {f(self.close_timeout)}",
            f"silent connections dropped: NATS within {f(self.nats_dead_after())} "
            f"(ping every {f(self.ping_interval)}, {self.max_outstanding_pings} unanswered), "
            f"PostgreSQL within {f(self.database_dead_after())} (TCP keepalive after "
            f"{f(self.keepalive_idle)}, {self.keepalive_count} probes "
            f"{f(self.keepalive_interval)} apart)",
            f"lease invariant: lease {f(self.lease)} > {self.invariant_terms()}",
        ]


def check_timeout_budget(budget: TimeoutBudget) -> None:
    """Refuse settings whose deadlines do not fit inside the lease (with the numbers).

    Checks the redelivery rule of :func:`check_lease_invariant` first, then that
    a publish, every redelivery and a completion's database call fit in a lease.
    """
    check_lease_invariant(budget.lease_settings)
    for name, value in (
        ("statement_timeout", budget.statement_timeout),
        ("publish_timeout", budget.publish_timeout),
    ):
        if value <= timedelta(0):
            raise LeaseInvariantViolated(f"{name} must be greater than zero")
    if budget.claim_ahead < timedelta(0):
        raise LeaseInvariantViolated("claim_ahead must not be negative")
    max_hold = budget.lease_settings.max_hold()
    if budget.claim_ahead > max_hold:
        raise LeaseInvariantViolated(
            "claim_ahead is longer than a worker may hold a run: claim_ahead must be at "
            f"most lease / 8 = {format_duration(budget.lease)} / 8 = "
            f"{format_duration(max_hold)} (the claim's lease covers the hold), but "
            f"claim_ahead = {format_duration(budget.claim_ahead)}. Lower claim_ahead, or "
            "raise lease."
        )
    if budget.lease <= budget.required_lease():
        raise LeaseInvariantViolated(
            "the timeouts do not fit the lease: lease must be greater than "
            f"{budget.invariant_terms()}, but lease = {format_duration(budget.lease)}. "
            "Raise lease, or lower statement_timeout, publish_timeout, ack_wait or "
            "max_deliver."
        )


# How long before its instant a run is claimed by default (then held by its worker).
DEFAULT_CLAIM_AHEAD = defaults.CLAIM_AHEAD

DEFAULT_TIMEOUTS = TimeoutBudget.from_settings(
    DEFAULT_LEASE.lease,
    DEFAULT_LEASE.ack_wait,
    DEFAULT_LEASE.max_deliver,
    claim_ahead=DEFAULT_CLAIM_AHEAD,
)
check_timeout_budget(DEFAULT_TIMEOUTS)

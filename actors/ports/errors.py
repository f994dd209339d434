"""The errors a port may raise that its callers tell apart: an outage is waited out,
a rejected record is not retried as it is."""

from __future__ import annotations


class Outage(Exception):
    """A server claimd needs is unreachable or restarting; trying again later is right.

    The supervisor restarts an actor that raises it with a short backoff and
    does not count it against the actor's crash budget: a database restart is
    not a bug, and must not make the process give up.
    """


class StoreUnavailable(Outage):
    """The database cannot be reached (refused, reset, shutting down, starting up)."""


class RecordRejected(Exception):
    """The store refused a write for what it contains, not for being unreachable.

    Retrying the same write cannot succeed; callers split or give up instead.
    """


class InboxSilent(Outage):
    """Fetches came back empty and the broker did not answer a ping: it may be away."""

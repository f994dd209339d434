"""Which database errors are an outage (wait it out) and which are about the data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from actors.observability import DependencyHealth
from actors.ports import RecordRejected
from actors.ports.translator import Fault, Translator, reads_only

__all__ = [
    "POSTGRES",
    "POSTGRES_HEALTH",
    "fault_of",
    "is_outage",
    "is_unreachable",
    "reads_only",
    "refuses_writes",
    "rejections",
]

POSTGRES_HEALTH = DependencyHealth("postgres")

# SQLSTATE classes that mean "try again later": connection exceptions,
# operator intervention (shutdown, cannot connect now), insufficient resources,
# transaction rollback (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "57", "53", "40")
# read_only_sql_transaction: what a server that was just demoted in a failover says.
_TRANSIENT_STATES = ("25006",)


@contextlib.contextmanager
def rejections() -> Iterator[None]:
    """Turn errors about the data itself into RecordRejected; let transient ones through."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", "") or ""
        if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
            raise
        raise RecordRejected(f"{type(exc).__name__}: {exc}") from exc


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means the database is away for now (wait it out), not a bug."""
    # InternalClientError is what asyncpg raises when a pooled connection the
    # server closed (a restart, pg_terminate_backend) is used again.
    if isinstance(
        exc,
        OSError
        | TimeoutError
        | asyncpg.PostgresConnectionError
        | asyncpg.exceptions.InternalClientError,
    ):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", "") or ""
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES
    return False


def is_unreachable(exc: BaseException) -> bool:
    """Whether an error (from connecting, say) means the database is away, not refusing us."""
    return is_outage(exc)


def refuses_writes(exc: BaseException) -> bool:
    """Whether the server answered but will not write: a read-only server or transaction
    (a standby just promoted the other way, ``default_transaction_read_only``)."""
    return getattr(exc, "sqlstate", None) in _TRANSIENT_STATES


def fault_of(exc: BaseException) -> Fault | None:
    """The outage ``exc`` means for the replica's store, or None (about the data, or a bug)."""
    if not is_outage(exc):
        return None
    return Fault.WRITES_REFUSED if refuses_writes(exc) else Fault.UNREACHABLE


# The replica's store (the run store and the job catalog): an outage is waited out;
# any other error is a bug, or about the data (``rejections``), and leaves as it is.
POSTGRES = Translator(fault_of)

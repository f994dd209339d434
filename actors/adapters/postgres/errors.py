"""Which database errors are an outage (wait it out) and which are about the data."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import asyncpg

from actors.observability import DependencyHealth
from actors.ports import RecordRejected, StoreUnavailable

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


P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


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


_READS = "_claimd_reads_only"


def reads_only(fn: F) -> F:
    """Marks a store method that only reads: its success says nothing about writes.

    While the database refuses writes it still answers these, and that must
    not look like the end of the outage (it did: one "unreachable" / "reachable
    again" pair per read, ~50 pairs in 21 s).
    """
    setattr(fn, _READS, True)
    return fn


def outage_as_store_unavailable(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``fn`` raising StoreUnavailable for an outage, and reporting the database's health."""
    reads = getattr(fn, _READS, False)

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            if is_outage(exc):
                reason = f"{fn.__name__}: {type(exc).__name__}: {exc}"
                if refuses_writes(exc):
                    POSTGRES_HEALTH.refused(reason)
                else:
                    POSTGRES_HEALTH.lost(reason)
                raise StoreUnavailable(reason) from exc
            raise
        if reads:
            POSTGRES_HEALTH.reached()
        else:
            POSTGRES_HEALTH.wrote()
        return result

    return wrapper


def store_methods_report_outages(cls: type[T]) -> type[T]:
    """Every public coroutine method raises StoreUnavailable when the database is away."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, outage_as_store_unavailable(member))
    return cls

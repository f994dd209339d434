"""One error translator for every store: what a store's driver raised leaves the store as
the port's error, and every call reports the dependency's health the same way.

A store says what its driver's errors mean with a :class:`Translator` (which ones are
an outage, and of which kind; which other ones its port names) and wraps its methods
with :func:`speaks_the_port`. The wrapper does the rest, the same for the replica's
store and the operator's, on PostgreSQL and in memory: an outage leaves as
StoreUnavailable, naming the call, after telling the store's ``health`` (unreachable,
or writes refused); a call that returns tells it the server answered (``reached``,
for a method marked :func:`reads_only`) or accepted a write (``wrote``). A store
whose ``health`` is None (a short-lived command's) reports nothing.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from actors.observability import DependencyHealth
from actors.ports.errors import StoreUnavailable

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Fault(enum.Enum):
    """What an outage is, for the dependency's health (actors.observability)."""

    UNREACHABLE = "unreachable"  # no answer: refused, reset or silent connections
    WRITES_REFUSED = "writes_refused"  # it answers, and will not write (read-only)


def _nothing(exc: BaseException) -> BaseException | None:
    return None


@dataclass(frozen=True)
class Translator:
    """What a store's driver raises, sorted.

    ``fault_of``: the outage an error means, or None. ``other``: the port's error
    for an error that is not an outage (a missing schema, a refusal), or None: then
    it is a bug and leaves as it is.
    """

    fault_of: Callable[[BaseException], Fault | None]
    other: Callable[[BaseException], BaseException | None] = _nothing

    def translate(
        self, exc: BaseException, call: str, health: DependencyHealth | None
    ) -> BaseException | None:
        """The error ``call`` raises for ``exc`` (None: ``exc`` itself), health told: an
        outage is StoreUnavailable naming the call, whatever raised it."""
        fault = self.fault_of(exc)
        if fault is None:
            return self.other(exc)
        reason = f"{call}: {type(exc).__name__}: {exc}"
        if health is not None:
            if fault is Fault.WRITES_REFUSED:
                health.refused(reason)
            else:
                health.lost(reason)
        return StoreUnavailable(reason)


_READS = "_claimd_reads_only"
_WRITES = "_claimd_writes"
_SPEAKS = "_claimd_speaks_the_port"


def reads_only(fn: F) -> F:
    """Marks a store method that only reads: its success says nothing about writes.

    While the database refuses writes it still answers these, and that must not
    look like the end of the outage (it did: one "unreachable" / "reachable again"
    pair per read, ~50 pairs in 21 s).
    """
    setattr(fn, _READS, True)
    return fn


def writes(fn: F) -> F:
    """Marks a method that writes, in a store whose methods read unless marked."""
    setattr(fn, _WRITES, True)
    return fn


def _speaking(
    translator: Translator, fn: Callable[P, Awaitable[R]], reads_unless_marked: bool
) -> Callable[P, Awaitable[R]]:
    reads = getattr(fn, _READS, reads_unless_marked) and not getattr(fn, _WRITES, False)

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        health: DependencyHealth | None = getattr(args[0], "health", None)
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            translated = translator.translate(exc, fn.__name__, health)
            if translated is None:
                raise
            raise translated from exc
        if health is not None:
            if reads:
                health.reached()
            else:
                health.wrote()
        return result

    setattr(wrapper, _SPEAKS, True)
    return wrapper


def speaks_the_port(
    translator: Translator, *, reads_unless_marked: bool = False
) -> Callable[[type[T]], type[T]]:
    """A class decorator: every public coroutine method of the class and of its bases
    speaks the port (see the module's docstring); each is wrapped once. A method
    writes unless marked :func:`reads_only`, or, with ``reads_unless_marked``, reads
    unless marked :func:`writes`."""

    def decorate(cls: type[T]) -> type[T]:
        for klass in reversed(cls.__mro__[:-1]):
            for name, member in vars(klass).items():
                if name.startswith("_") or not inspect.iscoroutinefunction(member):
                    continue
                current = getattr(cls, name)
                if not getattr(current, _SPEAKS, False):
                    setattr(cls, name, _speaking(translator, current, reads_unless_marked))
        return cls

    return decorate

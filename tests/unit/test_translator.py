"""The one error translator every store speaks through (actors.ports.translator)."""

from __future__ import annotations

import pytest

from actors.observability import DependencyHealth, DependencyState
from actors.ports import StoreUnavailable
from actors.ports.translator import Fault, Translator, reads_only, speaks_the_port, writes


class Refused(Exception):
    pass


def _fault(exc: BaseException) -> Fault | None:
    if isinstance(exc, ConnectionError):
        return Fault.UNREACHABLE
    if isinstance(exc, PermissionError):
        return Fault.WRITES_REFUSED
    return None


def _state(health: DependencyHealth | None) -> DependencyState | None:
    # Read through a call: mypy narrows the attribute after each comparison.
    return None if health is None else health.state


def _other(exc: BaseException) -> BaseException | None:
    return Refused(str(exc)) if isinstance(exc, LookupError) else None


class Base:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.health: DependencyHealth | None = DependencyHealth("translator-test")

    async def write(self) -> str:
        if self.error is not None:
            raise self.error
        return "written"

    @reads_only
    async def read(self) -> str:
        if self.error is not None:
            raise self.error
        return "read"


@speaks_the_port(Translator(_fault, _other))
class Store(Base):
    async def nested(self) -> str:
        return await self.write()


async def test_an_outage_leaves_as_store_unavailable_naming_the_call() -> None:
    store = Store(ConnectionError("refused"))
    with pytest.raises(StoreUnavailable, match=r"^write: ConnectionError: refused$"):
        await store.write()
    assert store.health is not None
    assert _state(store.health) is DependencyState.UNREACHABLE
    store.error = PermissionError("read-only")
    with pytest.raises(StoreUnavailable, match=r"^read: PermissionError: read-only$"):
        await store.read()
    assert _state(store.health) is DependencyState.WRITES_REFUSED


async def test_an_answered_read_ends_only_an_unreachable_outage_and_a_write_any() -> None:
    store = Store()
    assert store.health is not None
    store.health.refused("read-only")
    assert await store.read() == "read"
    assert _state(store.health) is DependencyState.WRITES_REFUSED
    assert await store.write() == "written"
    assert _state(store.health) is DependencyState.UP


async def test_other_errors_are_the_ports_or_left_as_they_are() -> None:
    with pytest.raises(Refused):
        await Store(KeyError("gone")).write()
    with pytest.raises(ValueError, match="a bug"):
        await Store(ValueError("a bug")).write()


async def test_a_nested_call_is_translated_once_and_no_health_reports_nothing() -> None:
    store = Store(ConnectionError("refused"))
    store.health = None
    with pytest.raises(StoreUnavailable, match=r"^write: ConnectionError"):
        await store.nested()  # the inner call translated; the outer leaves it alone


async def test_a_store_that_reads_unless_marked_reports_its_marked_writes() -> None:
    @speaks_the_port(Translator(_fault), reads_unless_marked=True)
    class Reader(Base):
        @writes
        async def act(self) -> str:
            return "acted"

    store = Reader()
    assert store.health is not None
    store.health.refused("read-only")
    assert await store.write() == "written"  # not marked: a read here
    assert _state(store.health) is DependencyState.WRITES_REFUSED
    assert await store.act() == "acted"
    assert _state(store.health) is DependencyState.UP

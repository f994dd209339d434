"""One ``store`` fixture over both stores: every contract test runs on each.

``[memory]``: the in-memory store on a manual clock. ``[postgres]``: the real
store, migrated in a schema of the test's own on the test server (marked
``integration`` as the other tests on a server are). Where the two disagree,
PostgreSQL is right and the in-memory store is fixed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.ports import ReplicaStore
from actors.testing.memory import InMemoryRunStore, ManualClock
from tests import servers
from tests.contract.rows import MemoryRows, PostgresRows, Rows

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]


@pytest.fixture(params=STORES)
async def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store_and_rows(kind: str) -> AsyncIterator[tuple[ReplicaStore, Rows]]:
    if kind == "memory":
        clock = ManualClock()
        memory = InMemoryRunStore(clock)
        yield memory, MemoryRows(memory, clock)
        return
    try:
        url = servers.database_url()
    except ImportError:  # no CLAIMD_TEST_DATABASE_URL, and no embedded server installed
        pytest.skip("no PostgreSQL: set CLAIMD_TEST_DATABASE_URL")
    schema = servers.unique_name("c_")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    pg = await PostgresRunStore.connect(servers.with_search_path(url, schema), max_size=4)
    try:
        await pg.migrate()
        yield pg, PostgresRows(pg)
    finally:
        await pg.close()
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()


@pytest.fixture
def store(store_and_rows: tuple[ReplicaStore, Rows]) -> ReplicaStore:
    """The store under test, through its port only."""
    return store_and_rows[0]


@pytest.fixture
def rows(store_and_rows: tuple[ReplicaStore, Rows]) -> Rows:
    """Its rows, arranged and read back beside the port."""
    return store_and_rows[1]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many contract tests passed on each store: CI's output shows the suite run twice."""
    counts = {"memory": 0, "postgres": 0}
    for report in terminalreporter.stats.get("passed", []):
        if report.when == "call" and "tests/contract/" in report.nodeid:
            ids = report.nodeid.rpartition("[")[2].rstrip("]").split("-")
            for name in counts:
                counts[name] += name in ids
    if any(counts.values()):
        terminalreporter.write_line(
            f"store contract: {counts['memory']} passed on [memory], "
            f"{counts['postgres']} passed on [postgres]"
        )

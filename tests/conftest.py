"""Fixtures: a private schema and a private JetStream stream per test, on real servers."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import nats
import pytest

from actors.adapters.nats import JetStreamBroker
from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig, parse_config
from tests import servers


@pytest.fixture(scope="session")
def database_url() -> str:
    return servers.database_url()


@pytest.fixture(scope="session")
def nats_url() -> str:
    return servers.nats_url()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    servers.stop_embedded()


@pytest.fixture
async def schema_url(database_url: str) -> AsyncIterator[str]:
    """A database URL whose connections live in a fresh schema, dropped afterwards."""
    schema = servers.unique_name("t_")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        await conn.close()
    yield servers.with_search_path(database_url, schema)
    conn = await asyncpg.connect(database_url)
    try:
        await _drop_schema(conn, schema)
    finally:
        await conn.close()


DROP_TRIES = 10


async def _drop_schema(conn: asyncpg.Connection, schema: str) -> None:
    """DROP SCHEMA, tried again when it deadlocks: a test whose ``spawn`` fixture comes
    before ``schema_url`` has its replicas stopped after the schema's teardown, and a
    replica still reading two tables can deadlock with the drop's exclusive locks (the
    drop is the victim; the replica goes on, so the next try gets its locks)."""
    for attempt in range(DROP_TRIES):
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            return
        except asyncpg.exceptions.DeadlockDetectedError:
            if attempt == DROP_TRIES - 1:
                raise


@pytest.fixture
async def store(schema_url: str) -> AsyncIterator[PostgresRunStore]:
    """A migrated store in the test's schema."""
    s = await PostgresRunStore.connect(schema_url, max_size=10)
    await s.migrate()
    yield s
    await s.close()


@pytest.fixture
async def deployment(nats_url: str) -> AsyncIterator[str]:
    """A deployment name of the test's own: its own stream and subject.

    Whatever created the stream (a fixture, an in-process replica, a `claimd`
    subprocess), it is deleted when the test ends.
    """
    name = servers.unique_name("t")
    yield name
    nc = await nats.connect(nats_url)
    try:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(f"CLAIMD_{name}")
    finally:
        await nc.close()


@pytest.fixture
async def broker(nats_url: str, deployment: str) -> AsyncIterator[JetStreamBroker]:
    """A connected broker with the test's stream and consumer created; deleted afterwards."""
    from datetime import timedelta

    b = await JetStreamBroker.connect(nats_url, f"CLAIMD_{deployment}", f"claimd.{deployment}.runs")
    await b.ensure_stream(timedelta(minutes=2))
    await b.ensure_consumer(timedelta(seconds=2), max_deliver=3, max_ack_pending=10_000)
    yield b
    await b.close()


@pytest.fixture
def make_config(
    tmp_path: Path, schema_url: str, nats_url: str, deployment: str
) -> Callable[..., LoadedConfig]:
    """Build a LoadedConfig for the test's schema and stream from a jobs TOML snippet."""

    def make(jobs_toml: str, **settings: object) -> LoadedConfig:
        values: dict[str, object] = {
            "database_url": schema_url,
            "nats_url": nats_url,
            "deployment": deployment,
            "http": "off",
            **settings,
        }
        lines = [
            f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value!r}"
            for key, value in values.items()
        ]
        text = "[claimd]\n" + "\n".join(lines) + "\n\n" + textwrap.dedent(jobs_toml)
        path = tmp_path / "claimd.toml"
        path.write_text(text)
        return parse_config(text, str(path), env={})

    return make

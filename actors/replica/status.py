"""What a replica answers about itself over HTTP: /readyz, the status page's jobs, the gauges.

Every answer goes through the ports (``ReplicaStore``, ``ReplicaBroker``);
none of it knows a driver. Before a server is connected its verdict says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from actors.observability import DependencyHealth, DependencyState, get_logger, redact
from actors.ports import ReplicaBroker, ReplicaStore
from actors.replica.cluster_reader import ClusterMetrics

log = get_logger("replica")

# /readyz: each dependency must answer a round trip within this long.
READY_TIMEOUT_S = 2.0
# A verdict that begins so: the server answers, and refuses writes.
DEGRADED = "degraded:"
# A scrape probes each server at most this often.
PROBE_EVERY_S = 1.0


class ReplicaStatus:
    """The replica's servers as HTTP reports them; ``store`` and ``broker`` are set while connected.

    ``health`` names the store's and the broker's dependency gauges
    (``claimd_dependency_up``), which a verdict sets: a server that holds the
    connection open and answers nothing is down, though no call has failed.
    """

    def __init__(self, store_health: DependencyHealth, broker_health: DependencyHealth) -> None:
        self.store: ReplicaStore | None = None
        self.broker: ReplicaBroker | None = None
        self.store_health = store_health
        self.broker_health = broker_health
        self.cluster_metrics = ClusterMetrics()
        self._probed_at = float("-inf")

    def connected(self, store: ReplicaStore | None) -> None:
        """The store is connected (or, with None, gone): the gauges read it from now on."""
        self.store = store
        self.cluster_metrics.read = None if store is None else store.cluster_figures

    async def refresh_metrics(self) -> None:
        """Before a scrape: the cluster gauges, and a round trip to each server (at most
        once a second) so that ``claimd_dependency_up`` is as fresh as the scrape."""
        now = asyncio.get_running_loop().time()
        probe = now - self._probed_at >= PROBE_EVERY_S
        if probe:
            self._probed_at = now
        await asyncio.gather(
            self.cluster_metrics.refresh(), self.ready() if probe else asyncio.sleep(0)
        )

    async def ready(self) -> dict[str, Any]:
        """A real round trip to each server, with a deadline: a frozen server fails it."""

        async def postgres() -> str:
            if self.store is None:
                return "not connected"
            await self.store.ping()
            return "ok"

        async def nats() -> str:
            if self.broker is None:
                return "not connected"
            return await self.broker.ready(READY_TIMEOUT_S)

        pg, nc = await asyncio.gather(_check(postgres), _check(nats))
        verdicts = {}
        for name, health, verdict in (
            ("postgres", self.store_health, pg),
            ("nats", self.broker_health, nc),
        ):
            if verdict == "ok":
                health.reached()
                if health.state is DependencyState.WRITES_REFUSED:
                    # It answers, and refuses what this replica must write: the
                    # API's reads still work, the scheduling does not.
                    verdict = f"{DEGRADED} {health.writes} refused ({health.reason[:200]})"
            elif verdict.startswith("no answer within"):
                health.lost(f"/readyz round trip: {verdict}")
            verdicts[name] = verdict
        return verdicts


async def _check(probe: Callable[[], Awaitable[str]]) -> str:
    try:
        return await asyncio.wait_for(probe(), READY_TIMEOUT_S)
    except TimeoutError:
        return f"no answer within {READY_TIMEOUT_S:g}s"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return redact(repr(exc))[:300]

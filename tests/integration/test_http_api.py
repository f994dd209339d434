"""The operator's HTTP surface of a running replica: health, readiness, jobs, status page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import eventually, running, succeeded_runs

pytestmark = pytest.mark.integration


async def test_status_page_api_and_probes(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    loaded = make_config(
        """
        [jobs.tick]
        every = "1s"
        run = { python = "actors.config.examples:hello" }
    """,
        http="127.0.0.1:0",
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    replica = Replica(tmp_path / "claimd.toml", loaded)
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving)

        async def succeeded() -> bool:
            return await succeeded_runs(store) > 0

        await eventually(succeeded)
        base = f"http://127.0.0.1:{replica.http_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as r:
                assert r.status == 200
            async with http.get(f"{base}/readyz") as r:
                assert r.status == 200
                assert (await r.json())["checks"] == {"postgres": "ok", "nats": "ok"}
            async with http.get(f"{base}/api/jobs") as r:
                (job,) = await r.json()
                assert job["name"] == "tick"
                assert job["last_success"] is not None
            async with http.get(f"{base}/") as r:
                page = await r.text()
                assert r.content_type == "text/html"
                assert "/static/status.js" in page  # the page renders the API itself
                assert "script-src 'self'" in r.headers["Content-Security-Policy"]
            async with http.get(f"{base}/static/status.js") as r:
                assert r.status == 200
                assert "textContent" in await r.text()
            async with http.get(f"{base}/api/grid?instants=5") as r:
                (grid,) = (await r.json())["jobs"]
                assert grid["name"] == "tick"
                assert grid["schedule_words"] == "every second"
                assert "succeeded" in [c["status"] for c in grid["cells"]]
            async with http.get(f"{base}/api/status") as r:
                status = await r.json()
                assert status["checks"] == {"postgres": "ok", "nats": "ok"}
                assert set(status["counters"]) >= {"deliveries_skipped", "fenced_completions"}
            async with http.get(f"{base}/metrics") as r:
                assert "claimd_runs_completed_total" in await r.text()

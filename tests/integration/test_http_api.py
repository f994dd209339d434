"""The operator's HTTP surface of a running replica: health, readiness, jobs, status page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from actors.replica.production import API_POOL_SIZE
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


OPERATE = "an-operate-token-for-the-tests-0123"
READ = "a-read-token-for-the-tests-01234567"


async def _get(
    http: aiohttp.ClientSession, url: str, token: str | None = None, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with http.get(url, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def test_reads_need_a_token_of_their_scope_and_only_allowed_hosts_are_answered(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """Tokens configured: run output, the job, the audit, the status, every API read
    answer 401 without a token and 200 with a read one; an action with a read token
    is 403; /healthz, /readyz, /metrics (setting metrics_token off) and the page's
    files stay open; a Host not allowed is 421 whatever the token; every answer
    carries the safe headers and no version; each read is logged with the token's
    name and scope, never the token."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops {OPERATE} operate\nviewer {READ} read\n")
    loaded = make_config(
        '[jobs.tick]\nevery = "1s"\nrun = { python = "actors.config.examples:hello" }\n',
        http="127.0.0.1:0",
        claim_interval="50ms",
        materialize_interval="200ms",
        api_token_file=str(tokens),
        allowed_hosts=["claimd.internal"],
    )
    replica = Replica(tmp_path / "claimd.toml", loaded)
    with capture_logs() as logs:
        async with running(replica):

            async def serving() -> bool:
                return replica.http_port not in (None, 0)

            await eventually(serving)

            async def succeeded() -> bool:
                return await succeeded_runs(store) > 0

            await eventually(succeeded)
            # The API reads on a small pool of its own, not the scheduler's.
            assert replica._api is not None
            api_pool = replica._api.service.history._pool  # type: ignore[attr-defined]
            assert api_pool.get_max_size() == API_POOL_SIZE
            assert api_pool is not replica.status.store.pool  # type: ignore[union-attr]
            run_id = await store.pool.fetchval(
                "SELECT id FROM job_runs WHERE state = 'succeeded' LIMIT 1"
            )
            base = f"http://127.0.0.1:{replica.http_port}"
            reads = [
                f"/api/runs/{run_id}",  # its output and error
                "/api/runs?job=tick",
                "/api/jobs",
                "/api/jobs/tick",
                "/api/jobs/tick/audit?from=2026-01-01%2000:00&to=2026-01-01%2000:01",
                "/api/grid",
                "/api/actions",
                "/api/config/rejected",
                "/api/status",
            ]
            async with aiohttp.ClientSession() as http:
                for path in reads:
                    status, headers, body = await _get(http, base + path)
                    assert status == 401, (path, body)
                    assert headers["WWW-Authenticate"] == "Bearer", path
                    assert (await _get(http, base + path, "wrong-" + READ))[0] == 401, path
                    for token in (READ, OPERATE):
                        status, _, body = await _get(http, base + path, token)
                        assert status == 200, (path, body[:300])
                for path in ("/healthz", "/readyz", "/metrics", "/", "/static/status.js"):
                    assert (await _get(http, base + path))[0] == 200, path
                pause = f"{base}/api/jobs/tick/pause"
                for given, expected in (("", 401), (READ, 403), (OPERATE, 200)):
                    auth = {"Authorization": f"Bearer {given}"} if given else {}
                    async with http.post(pause, headers=auth) as r:
                        assert r.status == expected, (given, await r.text())
                # DNS rebinding: a page of evil.example reaching 127.0.0.1 says so in Host.
                for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example"):
                    for path in ("/api/jobs", "/", "/metrics"):
                        status, headers, body = await _get(http, base + path, READ, Host=host)
                        assert status == 421, (host, path, body)
                        assert headers["X-Content-Type-Options"] == "nosniff"
                for host in ("localhost", f"127.0.0.1:{replica.http_port}", "claimd.internal"):
                    assert (await _get(http, base + "/api/jobs", READ, Host=host))[0] == 200
                for path in ("/api/jobs", "/healthz", "/nothing", "/metrics", "/"):
                    _, headers, _ = await _get(http, base + path)
                    assert headers["X-Content-Type-Options"] == "nosniff", path
                    assert headers["Referrer-Policy"] == "no-referrer", path
                    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
                    assert headers["Server"] == "claimd", path
    access = [e for e in logs if e.get("event") == "http: access"]
    assert {(e["token"], e["scope"]) for e in access} == {("viewer", "read"), ("ops", "operate")}
    assert all(e["remote"] == "127.0.0.1" and e["route"] for e in access), access[:3]
    assert any(e["route"] == "/api/runs/{run_id}" for e in access)
    assert not any(READ in str(e) or OPERATE in str(e) for e in logs)

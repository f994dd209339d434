"""The HTTP executor through the whole chain, against a local aiohttp server.

The request carries the run's identity (``Idempotency-Key`` = run id and the
``Claimd-*`` headers) and the filled body template; an unexpected status fails
the run, a server slower than the job's timeout times it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web

from actors.adapters.postgres import Operations, PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import RARE_CRON, eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = {
    "claim_interval": "50ms",
    "materialize_interval": "200ms",
    "reap_interval": "200ms",
    "shutdown_grace": "3s",
}


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: str


@dataclass
class HookServer:
    port: int
    received: list[Received]


@pytest.fixture
async def hook_server() -> AsyncIterator[HookServer]:
    """/ok answers 201, /bad 500, /slow only when the test ends."""
    received: list[Received] = []
    release = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        received.append(
            Received(request.method, request.path, dict(request.headers), await request.text())
        )
        if name == "bad":
            return web.Response(status=500, text="boom")
        if name == "slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), 30)
        return web.Response(status=201, text="accepted")

    app = web.Application()
    app.router.add_route("*", "/hook/{name}", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield HookServer(port, received)
    finally:
        release.set()
        await runner.cleanup()


def _http_job(name: str, port: int, *, timeout: str = "10s", expect: str = "[201]") -> str:
    body = '{"run": "{run_id}", "date": "{scheduled_date}", "attempt": {attempt}}'
    return f"""
        [jobs.{name}]
        cron = "{RARE_CRON}"
        timeout = "{timeout}"
        max_attempts = 1
        [jobs.{name}.run.http]
        url = "http://127.0.0.1:{port}/hook/{{job}}"
        method = "PUT"
        headers = {{ X-Team = "data" }}
        body = '{body}'
        expect_status = {expect}
    """


async def _run(store: PostgresRunStore, run_id: str) -> asyncpg.Record:
    row = await store.pool.fetchrow(
        "SELECT state, outcome, exit_code, error, claim_epoch, scheduled_at FROM job_runs "
        "WHERE id = $1::uuid",
        run_id,
    )
    assert row is not None
    return row


async def test_http_job_sends_identity_and_body_and_records_status_and_timeout(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, hook_server: HookServer
) -> None:
    port = hook_server.port
    loaded = make_config(
        _http_job("ok", port)
        + _http_job("bad", port, expect="[200]")
        + _http_job("slow", port, timeout="1s"),
        **FAST,
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    ops = Operations(store.pool)
    async with running(Replica(Path(loaded.path), loaded)):
        at = datetime.now(UTC)
        runs = {name: await ops.trigger(name, at) for name in ("ok", "bad", "slow")}

        async def all_ended() -> bool:
            states = {(await _run(store, r))["state"] for r in runs.values() if r}
            return states <= {"succeeded", "failed", "skipped", "cancelled"}

        await eventually(all_ended, timeout=30, what="the three http runs to end")

    assert all(runs.values())
    ok, bad, slow = [await _run(store, str(runs[n])) for n in ("ok", "bad", "slow")]
    assert (ok["state"], ok["outcome"], ok["exit_code"]) == ("succeeded", "succeeded", 201)
    assert (bad["state"], bad["outcome"], bad["exit_code"], bad["error"]) == (
        "failed",
        "failed",
        500,
        "HTTP 500",
    )
    assert (slow["state"], slow["outcome"]) == ("failed", "timed_out")

    by_path = {r.path: r for r in hook_server.received}
    assert sorted(by_path) == ["/hook/bad", "/hook/ok", "/hook/slow"]
    assert len(hook_server.received) == 3  # max_attempts = 1: one request each
    request = by_path["/hook/ok"]
    run_id = runs["ok"]
    assert request.method == "PUT"
    assert request.headers["Idempotency-Key"] == run_id
    assert request.headers["Claimd-Job"] == "ok"
    assert request.headers["Claimd-Scheduled-At"] == ok["scheduled_at"].isoformat()
    assert request.headers["Claimd-Attempt"] == "1"
    assert request.headers["Claimd-Fencing-Token"] == str(ok["claim_epoch"])
    assert request.headers["X-Team"] == "data"
    day = ok["scheduled_at"].date().isoformat()
    assert json.loads(request.body) == {"run": run_id, "date": day, "attempt": 1}
    assert by_path["/hook/bad"].headers["Idempotency-Key"] == runs["bad"]

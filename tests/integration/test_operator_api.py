"""The operator's HTTP API on a live replica: tokens, recorded actions, reads, and the contract.

Actions without a configured token answer 403, with a missing or wrong token 401, and
neither changes anything; with the right one the action happens and is recorded with
who and when. schemathesis checks every route against /openapi.json.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.http.openapi.operations import OPERATIONS, Scope
from actors.replica import Replica
from tests.integration.helpers import eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "t0ken-for-the-tests-" + "x" * 20
JOBS = """
[jobs.nightly]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
run = { python = "actors.config.examples:hello" }
"""
# The seeded history is from January: a retention longer than that keeps the
# replica's pruning from deleting it mid-test (seen once in CI).
FAST = {
    "http": "127.0.0.1:0",
    "claim_interval": "50ms",
    "materialize_interval": "200ms",
    "history_retention": "3650d",
}


@asynccontextmanager
async def api(loaded: LoadedConfig, tmp_path: Path, store: PostgresRunStore) -> AsyncIterator[str]:
    """A replica serving HTTP on a free port, its jobs synced; yields its base URL."""
    replica = Replica(tmp_path / "claimd.toml", loaded)
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, what="the replica's HTTP server")

        async def synced() -> bool:
            # HTTP serves before the jobs are synced (on a loaded machine, long
            # enough for a test to read or seed before the job exists).
            return bool(await store.pool.fetchval("SELECT count(*) FROM jobs"))

        await eventually(synced, what="the replica's jobs in the database")
        yield f"http://127.0.0.1:{replica.http_port}"


async def call(
    method: str, url: str, token: str | None = None, **kwargs: Any
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Claimd-Actor": "alice@laptop"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, headers=headers, **kwargs) as response,
    ):
        return response.status, await response.json(), dict(response.headers)


async def state_of_things(store: PostgresRunStore) -> tuple[Any, ...]:
    """Everything an action could change: the jobs, the runs, the action log."""
    jobs = await store.pool.fetch("SELECT name, paused FROM jobs ORDER BY name")
    runs = await store.pool.fetch("SELECT id, state FROM job_runs ORDER BY id")
    actions = await store.pool.fetchval("SELECT count(*) FROM operator_actions")
    return tuple(map(tuple, jobs)), tuple(map(tuple, runs)), actions


ACTIONS = [
    ("POST", "/api/jobs/nightly/pause", None),
    ("POST", "/api/jobs/nightly/trigger", {"at": "2026-12-01 02:00"}),
    ("POST", "/api/jobs/nightly/backfill", {"from": "2026-01-01", "to": "2026-01-03 23:59"}),
]


async def test_actions_without_a_token_or_with_a_wrong_one_change_nothing(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async with api(make_config(JOBS, **FAST), tmp_path, store) as base:
        before = await state_of_things(store)
        for method, path, body in ACTIONS:
            for token in (None, TOKEN):
                status, answer, _ = await call(method, base + path, token, json=body)
                assert status == 403, (path, answer)
                assert "read-only" in answer["error"]
        assert await state_of_things(store) == before

    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice-token {TOKEN}\n")
    with capture_logs() as logs:
        async with api(
            make_config(JOBS, api_token_file=str(tokens), **FAST), tmp_path, store
        ) as base:
            before = await state_of_things(store)
            for method, path, body in ACTIONS:
                for token in (None, "wrong-" + TOKEN, TOKEN[:-1]):
                    status, answer, headers = await call(method, base + path, token, json=body)
                    assert status == 401, (path, token, answer)
                    assert headers.get("WWW-Authenticate") == "Bearer"
            status, answer, _ = await call("GET", base + "/api/runs/not-a-uuid", TOKEN)
            assert status == 400
            assert "not a run id" in answer["error"]
            assert await state_of_things(store) == before

            started = await store.pool.fetchval("SELECT now()")
            done = [await call(m, base + p, TOKEN, json=b) for m, p, b in ACTIONS]
            assert [s for s, _, _ in done] == [200, 200, 200], done
            finished = await store.pool.fetchval("SELECT now()")
            triggered = done[1][1]
            assert triggered["scheduled_at"] == "2026-12-01T01:00:00+00:00"  # Berlin, +01:00
            assert done[2][1]["added"] == 3
            status, again, _ = await call("POST", base + "/api/jobs/nightly/pause", TOKEN)
            assert (status, again["error"]) == (409, "nightly is already paused")
            status, cancelled, _ = await call(
                "POST", f"{base}/api/runs/{triggered['run_id']}/cancel", TOKEN
            )
            assert status == 200, cancelled
            status, listed, _ = await call("GET", base + "/api/actions", TOKEN)
    assert await store.pool.fetchval("SELECT paused FROM jobs WHERE name = 'nightly'")
    rows = await store.pool.fetch("SELECT * FROM operator_actions ORDER BY id")
    assert [(r["action"], r["ok"], r["actor"], r["via"]) for r in rows] == [
        ("pause", True, "alice-token", "http"),
        ("trigger", True, "alice-token", "http"),
        ("backfill", True, "alice-token", "http"),
        ("pause", False, "alice-token", "http"),
        ("cancel", True, "alice-token", "http"),
    ]
    assert all(started <= r["at"] <= finished for r in rows[:3])
    assert all(r["origin"] == "127.0.0.1 for alice@laptop" for r in rows)
    assert json.loads(rows[1]["arguments"])["instant"] == "2026-12-01T01:00:00+00:00"
    assert [a["id"] for a in listed] == [r["id"] for r in reversed(rows)]
    assert not any(TOKEN in json.dumps(event, default=str) for event in logs)


async def test_a_trigger_of_a_future_or_absurd_instant_is_refused_and_changes_nothing(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """422 with the reason for an instant after now (the database's) or before 2000.

    A future instant's row would run now and take that instant's scheduled run's
    place for ever. An accepted one says whether the schedule names it.
    """
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice-token {TOKEN}\n")
    loaded = make_config(JOBS, api_token_file=str(tokens), **FAST)
    async with api(loaded, tmp_path, store) as base:
        trigger = base + "/api/jobs/nightly/trigger"
        now = await store.pool.fetchval("SELECT now()")
        tomorrow = f"{(now + timedelta(days=1)).date().isoformat()} 02:00"
        for at, words in (
            (tomorrow, "is later than now"),
            ("2999-01-01T00:00:00Z", "is later than now"),
            ("1900-01-01 02:00", "before 2000-01-01"),
            ("1999-12-31T23:59:59Z", "before 2000-01-01"),
        ):
            status, answer, _ = await call("POST", trigger, TOKEN, json={"at": at})
            assert status == 422, (at, answer)
            assert words in answer["error"], (at, answer)
        # Off the document's calendar (years 1900-2999): malformed, refused before the service.
        status, answer, _ = await call("POST", trigger, TOKEN, json={"at": "0001-01-01T00:00Z"})
        assert status == 400, answer
        assert "field 'at'" in answer["error"], answer
        # The materializer adds its own rows meanwhile: only the manual ones count here.
        manual = "SELECT count(*) FROM job_runs WHERE trigger = 'manual'"
        assert await store.pool.fetchval(manual) == 0
        refusals = "SELECT ok FROM operator_actions WHERE action = 'trigger'"
        assert [r["ok"] for r in await store.pool.fetch(refusals)] == [False] * 4

        status, named, _ = await call("POST", trigger, TOKEN, json={"at": "2026-06-01 02:00"})
        assert (status, named["scheduled_instant"]) == (200, True), named
        assert "a scheduled instant of nightly" in named["message"]
        status, extra, _ = await call("POST", trigger, TOKEN, json={"at": "2026-06-01 02:30"})
        assert (status, extra["scheduled_instant"]) == (200, False), extra
        assert "not an instant of nightly's schedule" in extra["message"]


async def test_reads_runs_pages_one_run_and_json_errors(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async with api(make_config(JOBS, **FAST), tmp_path, store) as base:
        job_id = await store.pool.fetchval("SELECT id FROM jobs WHERE name = 'nightly'")
        await store.pool.execute(
            "INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, finished_at, "
            "error) SELECT $1, t, t, 'failed', 'failed', t, 'exit status 3' "
            "FROM generate_series(timestamptz '2026-01-01 01:00Z', '2026-01-05 01:00Z', "
            "'1 day') AS t",
            job_id,
        )
        seen: list[str] = []
        cursor = None
        while True:
            query = {"job": "nightly", "limit": "2", **({"cursor": cursor} if cursor else {})}
            status, page, _ = await call("GET", base + "/api/runs", params=query)
            assert status == 200, page
            seen += [r["scheduled_at"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [f"2026-01-0{d}T01:00:00+00:00" for d in (5, 4, 3, 2, 1)]
        status, job, _ = await call("GET", base + "/api/jobs/nightly", params={"recent": "1"})
        assert status == 200
        assert job["last_outcome"]["error"] == "exit status 3"
        assert job["failures_24h"] == 0
        assert len(job["recent_runs"]) == 1
        status, audit, _ = await call(
            "GET",
            base + "/api/jobs/nightly/audit",
            params={"from": "2026-01-01", "to": "2026-01-05 23:00"},
        )
        assert status == 200
        assert audit["summary"]["counts"]["failed"] == 5
        assert audit["summary"]["complete"] is False
        for path, code in (
            ("/api/jobs/nope", 404),
            ("/api/runs?state=done", 400),
            ("/api/jobs/nightly/audit?from=2026-02-01&to=2026-01-01", 422),
            ("/api/nothing-here", 404),
        ):
            status, answer, _ = await call("GET", base + path)
            assert status == code, (path, answer)
            assert isinstance(answer["error"], str), (path, answer)
        status, doc, _ = await call("GET", base + "/openapi.json")
        assert doc["openapi"] == "3.1.0"
        assert "/api/jobs/{name}/audit" in doc["paths"]


def schemathesis_command() -> list[str]:
    beside = Path(sys.executable).with_name("st")
    found = str(beside) if beside.exists() else shutil.which("st")
    if found is None:  # a failure, not a skip: CI must never pass without this test
        pytest.fail("schemathesis is not installed (pip install '.[dev]')")
    return [found]


# A yearly job: a backfill of any range the document allows (years 1900-2999) writes a
# thousand rows at most, so the fuzzer's largest ranges stay quick.
YEARLY = """
[jobs.nightly]
cron = "0 0 1 1 *"
timezone = "Europe/Berlin"
run = { python = "actors.config.examples:hello" }
"""
SCHEMATHESIS_CONFIG = Path(__file__).with_name("schemathesis.toml")


async def schemathesis(base: str, cwd: Path, examples: int, *options: str) -> tuple[int, str]:
    """``st run`` with every check against the live replica at ``base``; (exit code, report)."""
    proc = await asyncio.create_subprocess_exec(
        *schemathesis_command(),
        "--config-file",
        str(SCHEMATHESIS_CONFIG),
        "run",
        f"{base}/openapi.json",
        "--checks",
        "all",
        *options,
        "--max-examples",
        str(examples),
        "--seed",
        "20261201",
        "--no-color",
        "--workers",
        "1",
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 200)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


READ_TOKEN = "a-read-token-for-the-tests-" + "y" * 20


@pytest.mark.schemathesis
async def test_every_route_conforms_to_the_openapi_document(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """Every check, positive_data_acceptance and the stateful links included, with an
    operate token, with a read token (every action's documented answer is then 403)
    and without one (every read's and action's is 401)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops {TOKEN} operate\nviewer {READ_TOKEN} read\n")
    loaded = make_config(YEARLY, api_token_file=str(tokens), **FAST)
    async with api(loaded, tmp_path, store) as base:
        await call("POST", base + "/api/jobs/nightly/trigger", TOKEN)  # a run to find
        operate = await schemathesis(
            base, tmp_path, 25, "--header", f"Authorization: Bearer {TOKEN}"
        )
        read = await schemathesis(
            base, tmp_path, 10, "--header", f"Authorization: Bearer {READ_TOKEN}"
        )
        without_token = await schemathesis(base, tmp_path, 10)
    # The counts follow from the route table: every operation tested, every one a
    # token guards answering 401 without one, every action 403 to a read token.
    guarded = sum(1 for op in OPERATIONS if op.scope is not Scope.OPEN)
    actions = sum(1 for op in OPERATIONS if op.scope is Scope.OPERATE)
    for code, report in (operate, read, without_token):
        assert code == 0, report[-6000:]
        # Every operation of the document but one: schemathesis 4 reports 18 tested of
        # the document's 19 (seen with 17 of 18 before /api/config was added).
        assert f"Tested: {len(OPERATIONS) - 1}" in report, report[-3000:]
        # "N generated, N passed": every case passed every check (warnings apart).
        assert re.search(r"\b(\d+) generated, \1 passed\b", report), report[-3000:]
    assert f"401 Unauthorized ({guarded} operations)" in without_token[1], without_token[1][-3000:]
    assert f"403 Forbidden ({actions} operations)" in read[1], read[1][-3000:]

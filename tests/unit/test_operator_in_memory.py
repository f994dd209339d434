"""The operator side on in-memory adapters: the HTTP API and the operator's commands
without a server.

The API is the real one (actors.http.api on the replica's build_app) over the
service over the in-memory operator store, driven by aiohttp's test client; a
whole replica on memory adapters answers its API on a real port; the commands
run as `claimd` registers them, their store opened by an in-memory opener.
What the port promises on both stores is tests/contract/test_operator.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from actors.cli.operator import OneLineParser, register
from actors.config import parse_config
from actors.domain import ExecutionResult, ExecutorSpec, Outcome, Overlap, RunContext, RunState
from actors.http.api import OperatorApi
from actors.http.server import build_app
from actors.operator import OperatorService
from actors.operator.models import Audit, Job
from actors.ports import Completion, OperatorStore, RejectedJob, StoreUnavailable
from actors.replica import Replica
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.testing.memory_operator import InMemoryOperatorStore
from actors.testing.memory_replica import MemoryPorts
from tests.contract.jobs import LEASE, job, message
from tests.unit.memory_world import until

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READ_TOKEN = "a-read-token-0123456789"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
Client = TestClient[web.Request, web.Application]


async def _store() -> InMemoryRunStore:
    """A store holding ``job`` (a rare cron) and ``beat``, with four runs of ``job`` in the
    past (one failed with an attempt, one running, two pending) and one ahead."""
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    await store.sync_jobs([job("job"), job("beat", cron="*/5 * * * *")])
    now = clock.now()
    for minutes in (40, 30, 20, 10):
        store.add_run("job", now - timedelta(minutes=minutes))
    store.add_run("job", now + timedelta(minutes=10))
    first, second = await store.claim_due_runs("c", 2, LEASE, 100)
    await store.start_runs("w", [message(first), message(second)], LEASE)
    failed = ExecutionResult(Outcome.FAILED, error="boom", exit_code=1)
    await store.complete_runs([Completion(first.run_id, first.epoch, failed, None, "w")])
    return store


@pytest.fixture
async def store() -> InMemoryRunStore:
    return await _store()


@pytest.fixture
async def client(store: InMemoryRunStore) -> AsyncIterator[Client]:
    api = OperatorApi(
        OperatorService(InMemoryOperatorStore(store)),
        [("alice", TOKEN), ("viewer", READ_TOKEN, "read")],
    )

    async def ready() -> dict[str, str]:
        return {"postgres": "ok", "nats": "ok"}

    async with TestClient(TestServer(build_app(ready, api))) as client:
        yield client


async def _json(client: Client, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """A request with the read token unless ``headers`` says otherwise."""
    kwargs.setdefault("headers", READ)
    async with client.request(method, path, **kwargs) as response:
        return response.status, await response.json()


async def test_the_api_reads_jobs_runs_a_run_the_audit_and_the_grid(client: Client) -> None:
    status, jobs = await _json(client, "GET", "/api/jobs")
    assert status == 200
    assert [(j["name"], j["running"], j["backlog"], j["ahead"]) for j in jobs] == [
        ("beat", 0, 0, 0),
        ("job", 1, 2, 1),
    ]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        query = {"limit": "3", "job": "job", **({"cursor": cursor} if cursor else {})}
        status, page = await _json(client, "GET", "/api/runs", params=query)
        assert status == 200
        seen += [r["scheduled_at"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 4
    assert seen == sorted(seen, reverse=True)
    status, failed_page = await _json(client, "GET", "/api/runs", params={"state": "failed"})
    [failed] = failed_page["runs"]
    status, detail = await _json(client, "GET", f"/api/runs/{failed['id']}")
    assert status == 200
    assert [(a["outcome"], a["error"], a["worker"]) for a in detail["attempts"]] == [
        ("failed", "boom", "w")
    ]
    status, audit = await _json(
        client,
        "GET",
        "/api/jobs/beat/audit",
        params={"from": "2025-12-31T23:00Z", "to": "2025-12-31T23:10Z"},
    )
    assert status == 200
    assert audit["summary"]["due"] == 0  # beat was declared at the store's now: nothing due
    status, grid = await _json(client, "GET", "/api/grid", params={"instants": "5"})
    assert status == 200
    assert [j["name"] for j in grid["jobs"]] == ["beat", "job"]
    assert (await _json(client, "GET", "/api/runs/not-a-uuid"))[0] == 400
    assert (await _json(client, "GET", "/api/jobs/nosuch"))[0] == 404


async def test_the_api_acts_with_a_token_and_records_every_action(
    client: Client, store: InMemoryRunStore
) -> None:
    assert (await _json(client, "POST", "/api/jobs/job/pause", headers={}))[0] == 401
    # A read token reads and may not act.
    status, refused = await _json(client, "POST", "/api/jobs/job/pause", headers=READ)
    assert (status, refused["error"]) == (
        403,
        "the token 'viewer' has scope read; this needs scope operate",
    )
    assert not store.jobs["job"].paused
    status, paused = await _json(client, "POST", "/api/jobs/job/pause", headers=AUTH)
    assert status == 200
    assert paused["actor"] == "alice"
    assert store.jobs["job"].paused
    assert (await _json(client, "POST", "/api/jobs/job/pause", headers=AUTH))[0] == 409
    assert (await _json(client, "POST", "/api/jobs/job/resume", headers=AUTH))[0] == 200
    future = (store.clock.now() + timedelta(hours=1)).isoformat()
    status, refused = await _json(
        client, "POST", "/api/jobs/job/trigger", headers=AUTH, json={"at": future}
    )
    assert status == 422
    assert "later than now" in refused["error"]
    status, triggered = await _json(client, "POST", "/api/jobs/job/trigger", headers=AUTH)
    assert status == 200
    assert store.runs[triggered["run_id"]].trigger == "manual"
    status, _ = await _json(client, "POST", f"/api/runs/{triggered['run_id']}/cancel", headers=AUTH)
    assert status == 200
    assert store.runs[triggered["run_id"]].state is RunState.CANCELLED
    status, backfilled = await _json(
        client,
        "POST",
        "/api/jobs/beat/backfill",
        headers=AUTH,
        json={"from": "2025-12-31T23:00Z", "to": "2025-12-31T23:30Z"},
    )
    assert status == 200
    assert (backfilled["instants"], backfilled["added"]) == (7, 7)
    status, log = await _json(client, "GET", "/api/actions")
    assert status == 200
    assert [(a["action"], a["ok"]) for a in log] == [
        ("backfill", True),
        ("cancel", True),
        ("trigger", True),
        ("trigger", False),
        ("resume", True),
        ("pause", False),
        ("pause", True),
    ]
    assert all(a["actor"] == "alice" and a["via"] == "http" for a in log)


async def test_the_api_lists_rejected_jobs_and_answers_503_while_the_store_is_away(
    client: Client, store: InMemoryRunStore
) -> None:
    await store.record_rejected_jobs("r1", [RejectedJob("job", "jobs.job", "cron", "bad cron")])
    status, rejected = await _json(client, "GET", "/api/config/rejected")
    assert status == 200
    assert [(r["job"], r["field"], r["old_definition_running"]) for r in rejected] == [
        ("job", "cron", True)
    ]
    store.outage = StoreUnavailable("restarting")
    status, answer = await _json(client, "GET", "/api/jobs")
    assert status == 503
    assert "unavailable" in answer["error"]


async def test_a_replica_on_memory_adapters_serves_its_operator_api(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {TOKEN}\n")
    text = textwrap.dedent(
        f"""
        [claimd]
        deployment = "mem"
        http = "127.0.0.1:0"
        api_token_file = "{tokens}"
        claim_interval = "5ms"
        materialize_interval = "5ms"

        [jobs.tick]
        every = "10s"
        run = {{ python = "tests.unit.jobfuncs:sync_job" }}
        """
    )
    path = tmp_path / "claimd.toml"
    path.write_text(text)
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    bundle = MemoryPorts(store, InMemoryBroker(), _NoExecutor(), MemoryInbox())
    replica = Replica(path, parse_config(text, str(path), env={}), bundle=bundle)
    task = asyncio.create_task(replica.run())
    try:
        # The replica hands the API its service as soon as the store is open, before
        # it syncs the jobs: once ``tick`` is in the store, the API answers from it.
        await until(lambda: replica.http_port not in (None, 0) and "tick" in store.jobs, "synced")
        base = f"http://127.0.0.1:{replica.http_port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/api/jobs", headers=AUTH) as response:
                status, jobs = response.status, await response.json()
            assert status == 200, jobs  # 503 when the API had no service in memory
            assert [j["name"] for j in jobs] == ["tick"]
            async with session.post(base + "/api/jobs/tick/pause", headers=AUTH) as response:
                assert response.status == 200
        assert store.jobs["tick"].paused
    finally:
        replica.stop_requested.set()
        await asyncio.wait_for(task, 30)


class _NoExecutor:
    """An executor that is never asked (the job is paused before anything is due)."""

    def runs_inline(self, executor: str | None) -> bool:
        return False

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        return ExecutionResult(Outcome.SUCCEEDED)


# --- the operator's commands ----------------------------------------------------------


def _claimd(store: InMemoryRunStore) -> argparse.ArgumentParser:
    """The operator's commands as `claimd` registers them, their store in memory."""

    async def open_store(url: str, timeout: float) -> OperatorStore:
        assert url == "memory://"
        return InMemoryOperatorStore(store)

    parser = OneLineParser(prog="claimd")
    register(parser.add_subparsers(dest="command", required=True), open_store)
    return parser


def _cli(store: InMemoryRunStore, capsys: pytest.CaptureFixture[str], *argv: str) -> int:
    args = _claimd(store).parse_args([*argv, "--database-url", "memory://"])
    code: int = args.func(args)
    return code


def test_the_operator_commands_run_on_the_in_memory_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = asyncio.run(_store())
    assert _cli(store, capsys, "jobs", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(j["name"], j["backlog"]) for j in listed] == [("beat", 0), ("job", 2)]
    assert _cli(store, capsys, "runs", "job", "--limit", "2") == 0
    assert "job" in capsys.readouterr().out
    assert _cli(store, capsys, "pause", "job", "--actor", "bob") == 0
    assert "paused job" in capsys.readouterr().out
    assert _cli(store, capsys, "pause", "job") == 3  # already paused: nothing to do
    assert "already paused" in capsys.readouterr().err
    assert _cli(store, capsys, "trigger", "job", "--at", "2026-01-01T01:00Z") == 2  # after now
    assert "later than now" in capsys.readouterr().err
    assert _cli(store, capsys, "show", "0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b") == 3
    capsys.readouterr()
    assert _cli(store, capsys, "actions", "--json") == 0
    log = json.loads(capsys.readouterr().out)
    assert [(a["action"], a["ok"], a["actor"], a["via"]) for a in log] == [
        ("trigger", False, log[0]["actor"], "cli"),
        ("pause", False, log[0]["actor"], "cli"),
        ("pause", True, "bob", "cli"),
    ]
    store.outage = StoreUnavailable("restarting")
    assert _cli(store, capsys, "jobs") == 4  # the store is away: exit 4, one line
    assert capsys.readouterr().err.startswith("error: lost the database")


async def test_the_commands_http_client_reaches_every_route_it_names_through_the_route_table(
    client: Client,
) -> None:
    """`claimd ... --url`: each read and action the commands make, by its operation id in
    the one route table the server is built from, answered by that server (no 404)."""
    from actors.cli.operator.connect import HttpBackend

    base = str(client.server.make_url("/"))
    backend = HttpBackend(base, TOKEN, "tester", 5.0)
    try:
        jobs = await backend.get("jobs")
        # The reads come back as the operator's read models, the ones the service returns.
        assert {j.name for j in jobs} == {"job", "beat"}
        assert isinstance(jobs[0], Job)
        assert (await backend.get("job", name="job")).name == "job"
        runs = (await backend.get("runs", job="job", limit=10)).runs
        assert (await backend.get("run", run_id=runs[0].id)).id == runs[0].id
        audit = await backend.get("audit", job="job", start="2026-01-01", end="now")
        assert isinstance(audit, Audit)
        await backend.get("actions")
        await backend.get("rejected_jobs")
        assert (await backend.act("pause", job="beat"))["action"] == "pause"
        resumed = await backend.act("resume", job="beat", paused_instants="skip")
        assert resumed["paused_instants"] == "skip"
    finally:
        await backend.close()


async def test_a_trigger_of_a_forbid_job_with_a_run_active_says_so_through_the_api() -> None:
    """The answer names the run the new one waits for (overlap queue, the default); asked
    for forbid it is refused (422) rather than added to be skipped; a backfill records
    its runs' mode."""
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    await store.sync_jobs([job("single", overlap=Overlap.FORBID), job("free")])
    store.add_run("single", clock.now() - timedelta(minutes=5))
    [busy] = await store.claim_due_runs("c", 10, LEASE, 100)
    await store.start_runs("w", [message(busy)], LEASE)
    api = OperatorApi(OperatorService(InMemoryOperatorStore(store)), [("alice", TOKEN)])

    async def ready() -> dict[str, str]:
        return {"postgres": "ok", "nats": "ok"}

    async with TestClient(TestServer(build_app(ready, api))) as client:
        path = "/api/jobs/single/trigger"
        status, refused = await _json(
            client, "POST", path, headers=AUTH, json={"overlap": "forbid"}
        )
        assert status == 422
        assert f"single has run {busy.run_id} running and overlap forbid" in refused["error"]
        assert "nothing added" in refused["error"]
        status, queued = await _json(client, "POST", path, headers=AUTH)
        assert status == 200
        assert (queued["overlap"], queued["waits_for"]) == ("queue", busy.run_id)
        assert queued["message"].endswith(
            f"; overlap queue: it waits its turn, single's run {busy.run_id} is running"
        )
        assert store.runs[queued["run_id"]].overlap is Overlap.QUEUE
        status, wrong = await _json(
            client, "POST", "/api/jobs/free/trigger", headers=AUTH, json={"overlap": "queue"}
        )
        assert status == 422
        assert "does not apply to free, whose overlap is allow" in wrong["error"]
        status, backfilled = await _json(
            client,
            "POST",
            "/api/jobs/single/backfill",
            headers=AUTH,
            json={"from": "2025-01-01T00:00Z", "to": "2025-01-01T00:00Z", "overlap": "allow"},
        )
        assert status == 200
        assert (backfilled["overlap"], backfilled["added"]) == ("allow", 1)
        assert backfilled["message"].endswith("; overlap allow: they may run at once")
    # Nothing was skipped for overlap: the queued run waits, pending.
    assert await store.skip_unrunnable(10) == []
    assert store.runs[queued["run_id"]].state is RunState.PENDING


async def test_an_audit_range_too_large_is_refused_before_any_history_is_read(
    store: InMemoryRunStore,
) -> None:
    """A range of a million instants answers 422 at once: the history is never read
    (it was read, up to 200,000 rows, before the range was checked)."""
    from actors.operator import Unprocessable

    service = OperatorService(InMemoryOperatorStore(store))

    async def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("the history was read for a range refused anyway")

    service.history.audit_records = never  # type: ignore[method-assign]
    with pytest.raises(Unprocessable, match="more than 10000 instants"):
        await service.audit("beat", "2000-01-01", "2026-01-01")

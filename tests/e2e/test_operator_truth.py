"""Operator actions and the CLI tell the truth and cannot lose a run (issue 18).

Through the real entry points: `claimd` in subprocesses and a replica's HTTP API.

- `claimd resume --paused-instants skip` runs none of the instants that came due
  while the job was paused, and the audit lists each as paused (a skipped row or
  a recorded gap), never missing; the API takes the same choice; the default
  answer says what the catch-up policy will do.
- `claimd dev` and `claimd run` with their HTTP port busy say which port and how
  to choose another, and exit 2.
- Operator commands given `--config` read its database_url alone: the API
  token's variable (the replica's) is not needed in the operator's shell.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from actors.adapters.embedded import free_port
from actors.adapters.postgres import PostgresRunStore
from actors.config import parse_config
from tests.e2e.helpers import (
    ClaimdProcess,
    effect_job,
    eventually,
    http_port_of,
    read_effects,
    write_config,
)
from tests.e2e.test_cli import run_config, short_data_dir, spawn, stop_embedded_postgres
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

TOKEN = "operator-truth-token-" + "y" * 20
__all__ = ["spawn"]  # the fixture, shared with test_cli
PAUSED_S = 5  # instants of the 1 s job that come due while it is paused


async def _db(schema_url: str, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(schema_url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def _pause_began(schema_url: str) -> datetime:
    at = await _db(
        schema_url,
        "SELECT at FROM operator_actions WHERE job = 'beat' AND action = 'pause' AND ok "
        "ORDER BY id DESC LIMIT 1",
    )
    assert isinstance(at, datetime)
    return at


async def _instants_pass(schema_url: str, since: datetime, seconds: int) -> None:
    """Wait until the database's clock is ``seconds`` past ``since`` (polled)."""

    async def passed() -> bool:
        now = await _db(schema_url, "SELECT now()")
        assert isinstance(now, datetime)
        return now >= since + timedelta(seconds=seconds)

    await eventually(passed, timeout=30, what=f"{seconds} instants to come due while paused")


async def _ran_after(effects: Path, instant: datetime) -> None:
    async def ran() -> bool:
        return any(e.scheduled_at > instant for e in read_effects(effects))

    await eventually(ran, timeout=30, what="a run of an instant after the resume")


def _executed_between(effects: Path, after: datetime, until: datetime) -> list[str]:
    return [
        e.scheduled_at.isoformat() for e in read_effects(effects) if after < e.scheduled_at <= until
    ]


async def test_resume_can_skip_the_paused_instants_and_the_audit_calls_them_paused(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    effects = tmp_path / "effects.txt"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops {TOKEN}\n")
    # A short horizon: some paused instants have a row written ahead (pending), the
    # later ones none yet; skip must account for both kinds.
    config = run_config(
        tmp_path / "claimd.toml",
        schema_url,
        nats_url,
        deployment,
        effect_job("beat", effects),
        horizon="3s",
        api_token_file=str(tokens),
    )
    replica = spawn("run", "--config", str(config))

    async def running() -> bool:
        assert replica.returncode() is None, replica.stderr()[-2000:]
        return len(read_effects(effects)) >= 2 and http_port_of(replica) is not None

    await eventually(running, timeout=45, what="the replica to run beat")
    db = ["--database-url", schema_url]

    # 1. The CLI: pause, let PAUSED_S instants come due, resume skipping them.
    paused = await claimd("pause", "beat", *db)
    assert paused.code == 0, paused
    pause_at = await _pause_began(schema_url)
    await _instants_pass(schema_url, pause_at, PAUSED_S)
    resumed = await claimd("resume", "beat", "--paused-instants", "skip", "--json", *db)
    assert resumed.code == 0, resumed
    answer = json.loads(resumed.out)
    assert answer["paused_instants"] == "skip"
    resume_at = datetime.fromisoformat(answer["at"])
    assert answer["runs_skipped"] >= 1, answer  # written ahead within the horizon
    assert answer["instants_gapped"] >= 1, answer  # beyond it: recorded as a gap
    assert answer["runs_skipped"] + answer["instants_gapped"] >= PAUSED_S, answer
    await _ran_after(effects, resume_at)  # the schedule goes on from the resume
    assert _executed_between(effects, pause_at, resume_at) == []

    audit = await claimd(
        "audit",
        "beat",
        "--from",
        pause_at.isoformat(),
        "--to",
        resume_at.isoformat(),
        "--json",
        *db,
    )
    assert audit.code == 0, audit  # complete: nothing missing
    entries = [
        e
        for e in json.loads(audit.out)["entries"]
        if datetime.fromisoformat(e["scheduled_at"]) > pause_at
    ]
    assert len(entries) >= PAUSED_S
    assert {e["status"] for e in entries} == {"skipped", "paused"}, entries
    assert all(e["reason"].startswith("paused ") for e in entries), entries
    assert all("with the paused instants skipped" in e["reason"] for e in entries), entries

    # 2. The API takes the same choice; anything but run or skip is refused (400).
    base = f"http://127.0.0.1:{http_port_of(replica)}/api/jobs/beat"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.post(f"{base}/pause") as response:
            assert response.status == 200, await response.text()
        pause_at = await _pause_began(schema_url)
        await _instants_pass(schema_url, pause_at, 2)
        async with http.post(f"{base}/resume", json={"paused_instants": "later"}) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert "paused_instants" in error, error
            assert "'run' or 'skip'" in error, error
        async with http.post(f"{base}/resume", json={"paused_instants": "skip"}) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
    assert body["paused_instants"] == "skip"
    resume_at = datetime.fromisoformat(body["at"])
    await _ran_after(effects, resume_at)
    assert _executed_between(effects, pause_at, resume_at) == []
    replica.terminate()
    assert await replica.wait(30) == 0


async def test_resume_by_default_skips_the_paused_instants_and_says_so_first(
    store: PostgresRunStore, schema_url: str
) -> None:
    loaded = parse_config('[jobs.beat]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n', env={})
    await store.sync_jobs(list(loaded.jobs.values()))
    db = ["--database-url", schema_url]
    assert (await claimd("pause", "beat", *db)).code == 0
    resumed = await claimd("resume", "beat", *db)
    assert resumed.code == 0, resumed
    assert "paused instants skipped, none runs" in resumed.out
    assert "--paused-instants run" in resumed.out
    assert (await claimd("pause", "beat", *db)).code == 0
    ran = await claimd("resume", "beat", "--paused-instants", "run", *db)
    assert ran.code == 0, ran
    assert 'catch-up policy says (catchup = "all", catchup_window = "1h")' in ran.out
    help_text = await claimd("resume", "--help")
    assert "--paused-instants {run,skip}" in help_text.out


def _listening() -> socket.socket:
    """A socket holding a port, as another program on the machine would."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


async def test_a_busy_http_port_is_named_with_how_to_choose_another_and_exit_2(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    job = '[jobs.tick]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n'
    data_dir = short_data_dir()
    with _listening() as holder:
        port = holder.getsockname()[1]
        dev_config = write_config(tmp_path / "dev.toml", jobs=job)
        try:
            dev = spawn(
                "dev",
                "--data-dir",
                str(data_dir),
                "--http",
                f"127.0.0.1:{port}",
                "--nats-port",
                str(free_port()),
                "--config",
                str(dev_config),
                label="dev",
            )
            assert await dev.wait(30) == 2, dev.stderr()[-2000:]
        finally:
            stop_embedded_postgres(data_dir)
        assert dev.stderr().strip() == (
            f"claimd dev: port {port} on 127.0.0.1 is in use; choose another with "
            "--http 127.0.0.1:PORT (--http 127.0.0.1:0 picks a free one)"
        )
        assert dev.stdout() == ""

        config = run_config(
            tmp_path / "claimd.toml",
            schema_url,
            nats_url,
            deployment,
            job,
            http=f"127.0.0.1:{port}",
        )
        replica = spawn("run", "--config", str(config), label="run")
        assert await replica.wait(30) == 2, replica.stderr()[-2000:]
    (stopping,) = [e for e in replica.logs() if e.get("level") == "error"]
    assert stopping["event"] == "stopping: the HTTP port cannot be served"
    assert stopping["error"].startswith(f"port {port} on 127.0.0.1 is in use; set another http")


async def test_operator_commands_given_config_read_only_its_database_url(
    store: PostgresRunStore, schema_url: str, tmp_path: Path
) -> None:
    # The replica's environment holds the token; the operator's shell does not.
    config = write_config(
        tmp_path / "claimd.toml",
        database_url=schema_url,
        api_token_env="CLAIMD_TEST_TOKEN_NOT_IN_THIS_SHELL",
        jobs='[jobs.tick]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n',
    )
    loaded = parse_config(
        config.read_text(), str(config), env={"CLAIMD_TEST_TOKEN_NOT_IN_THIS_SHELL": TOKEN}
    )
    await store.sync_jobs(list(loaded.jobs.values()))
    listed = await claimd("jobs", "--json", "--config", str(config))
    assert listed.code == 0, listed
    assert [j["name"] for j in json.loads(listed.out)] == ["tick"]
    paused = await claimd("pause", "tick", "--config", str(config))
    assert paused.code == 0, paused
    # reload checks the jobs of the file, not the token the replica reads.
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    checked = await claimd("reload", "--pid", str(dead.pid), "--config", str(config))
    assert (checked.code, checked.err.strip()) == (3, f"error: no process {dead.pid}"), checked

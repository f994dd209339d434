"""The operator's commands through the real `claimd` entry point, as an operator types them.

Every bad input gives one line on stderr, nothing on stdout and the documented exit
status (0 done, 1 failed/incomplete, 2 bad input, 3 nothing to do / not found,
4 unreachable); `--json` output parses; times without an offset are read in the
job's zone; commands find a running `claimd dev` of their directory with no flags.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.embedded import free_port
from actors.adapters.postgres import PostgresRunStore
from actors.cli.operator.connect import ENDPOINTS_FILE
from actors.config import parse_config
from tests.e2e.helpers import (
    ClaimdProcess,
    child_env,
    claimd_command,
    effect_job,
    eventually,
    write_config,
)
from tests.e2e.test_cli import (
    dev_session,
    run_config,
    short_data_dir,
    spawn,
    stop_embedded_postgres,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
__all__ = ["spawn"]  # the fixture, shared with test_cli

JOBS = """
[jobs.nightly]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }

[jobs.held]
cron = "0 3 * * *"
run = { shell = ["/bin/true"] }
"""
FINISHED_AT = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)  # 02:00 in Berlin
TOMORROW_0200 = f"{(datetime.now(UTC) + timedelta(days=1)).date().isoformat()} 02:00"
UNKNOWN_RUN = "00000000-0000-4000-8000-000000000000"


@dataclass
class Result:
    code: int
    out: str
    err: str


async def claimd(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *claimd_command(),
        *args,
        cwd=cwd,
        env=env or child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@pytest.fixture
async def seeded(store: PostgresRunStore, schema_url: str, tmp_path: Path) -> dict[str, str]:
    """Two jobs (one paused), one finished run of nightly at 02:00 Berlin on 1 January."""
    loaded = parse_config(JOBS, "jobs.toml", env={})
    await store.sync_jobs(list(loaded.jobs.values()))
    await store.pool.execute("UPDATE jobs SET paused = true WHERE name = 'held'")
    run_id = await store.pool.fetchval(
        "INSERT INTO job_runs (job_id, scheduled_at, due_at, state, outcome, finished_at) "
        "SELECT id, $1, $1, 'succeeded', 'succeeded', now() FROM jobs WHERE name = 'nightly' "
        "RETURNING id::text",
        FINISHED_AT,
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('[jobs.x]\ncron = "61 * * * *"\nrun = { shell = ["/bin/true"] }\n')
    return {
        "db": schema_url,
        "run": run_id,
        "bad_config": str(bad),
        "closed": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
    }


# (arguments, exit status, words on the one stderr line). {db} is the test's database.
BAD_INPUT = [
    (["jobs", "--database-url", "{closed}"], 4, "cannot reach the database"),
    (["jobs", "--url", "http://127.0.0.1:{port}"], 4, "cannot reach the claimd API"),
    (["jobs", "--database-url", "not-a-url"], 2, "not a usable database URL"),
    (["jobs", "--config", "/nonexistent/claimd.toml"], 2, "cannot read"),
    (
        ["runs", "nightly", "--since", "yesterday", "--database-url", "{db}"],
        2,
        "not an ISO 8601 time",
    ),
    (
        ["runs", "--since", "2026-02-01", "--until", "2026-01-01", "--database-url", "{db}"],
        2,
        "before since",
    ),
    (["runs", "nope", "--database-url", "{db}"], 3, "no job named 'nope'"),
    (["runs", "--state", "done", "--database-url", "{db}"], 2, "unknown state 'done'"),
    (["runs", "--limit", "0", "--database-url", "{db}"], 2, "limit must be between"),
    (["runs", "--limit", "many", "--database-url", "{db}"], 2, "invalid int value"),
    (["show", "12345", "--database-url", "{db}"], 3, "no job named '12345'"),
    (["show", "held", "--database-url", "{db}"], 3, "job 'held' has no run yet"),
    (["audit", "nightly", "--database-url", "{db}"], 2, "give --from and --to"),
    (
        ["audit", "nightly", "--at", "2026-01-01", "--to", "2026-01-02", "--database-url", "{db}"],
        2,
        "not both",
    ),
    (["show", UNKNOWN_RUN, "--database-url", "{db}"], 3, "no run"),
    (
        ["audit", "nope", "--from", "2026-01-01", "--to", "2026-01-02", "--database-url", "{db}"],
        3,
        "no job named 'nope'",
    ),
    (
        [
            "audit",
            "nightly",
            "--from",
            "2026-01-32",
            "--to",
            "2026-02-01",
            "--database-url",
            "{db}",
        ],
        2,
        "not an ISO 8601 time",
    ),
    (
        [
            "audit",
            "nightly",
            "--from",
            "2026-02-01",
            "--to",
            "2026-01-01",
            "--database-url",
            "{db}",
        ],
        2,
        "ends",
    ),
    (
        [
            "audit",
            "nightly",
            "--from",
            "1990-01-01",
            "--to",
            "2026-01-01",
            "--database-url",
            "{db}",
        ],
        2,
        "more than 10000 instants",
    ),
    (
        ["audit", "nightly", "--from", "2026-01-01", "--database-url", "{db}"],
        2,
        "give --from and --to",
    ),
    (["actions", "--limit", "5000", "--database-url", "{db}"], 2, "limit must be between"),
    (["pause", "nope", "--database-url", "{db}"], 3, "no enabled job named 'nope'"),
    (["pause", "held", "--database-url", "{db}"], 3, "already paused"),
    (["resume", "nightly", "--database-url", "{db}"], 3, "already running"),
    (
        ["trigger", "nightly", "--at", "02:00 tomorrow", "--database-url", "{db}"],
        2,
        "not an ISO 8601 time",
    ),
    (["trigger", "nope", "--database-url", "{db}"], 3, "no job named 'nope'"),
    # Tomorrow's 02:00 (the case): running it now would use up that instant.
    (
        ["trigger", "nightly", "--at", TOMORROW_0200, "--database-url", "{db}"],
        2,
        "is later than now",
    ),
    (
        ["trigger", "nightly", "--at", "2999-01-01T00:00Z", "--database-url", "{db}"],
        2,
        "is later than now",
    ),
    (
        ["trigger", "nightly", "--at", "1900-01-01 02:00", "--database-url", "{db}"],
        2,
        "before 2000-01-01",
    ),
    (
        ["trigger", "nightly", "--at", "2026-01-01 02:00", "--database-url", "{db}"],
        3,
        "already has a run at 2026-01-01T01:00:00+00:00",
    ),
    (["cancel", "not-a-uuid", "--database-url", "{db}"], 2, "not a run id"),
    (["cancel", "{run}", "--database-url", "{db}"], 3, "is succeeded; nothing to cancel"),
    (["cancel", UNKNOWN_RUN, "--database-url", "{db}"], 3, "no run"),
    (
        [
            "backfill",
            "nightly",
            "--from",
            "2026-01-05",
            "--to",
            "2026-01-01",
            "--database-url",
            "{db}",
        ],
        2,
        "is after to",
    ),
    (
        ["backfill", "nightly", "--from", "soon", "--to", "2026-01-01", "--database-url", "{db}"],
        2,
        "not an ISO 8601 time",
    ),
    (
        [
            "backfill",
            "nope",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--database-url",
            "{db}",
        ],
        3,
        "no job named 'nope'",
    ),
    (
        [
            "backfill",
            "nightly",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--max-runs",
            "0",
            "--database-url",
            "{db}",
        ],
        2,
        "--max-runs: expected a positive whole number",
    ),
    (["reload", "--pid", "{dead_pid}"], 3, "no process"),
    (["reload", "--pid-file", "/nonexistent/claimd.pid"], 2, "cannot read a pid"),
    (["reload", "--pid", "1", "--config", "{bad_config}"], 2, "would refuse this file"),
]


async def _dead_pid() -> int:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    BAD_INPUT,
    ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _, _) in enumerate(BAD_INPUT)],
)
async def test_bad_input_is_one_line_and_a_documented_exit_status(
    seeded: dict[str, str], tmp_path: Path, argv: list[str], code: int, words: str
) -> None:
    values = {**seeded, "port": str(free_port()), "dead_pid": str(await _dead_pid())}
    result = await claimd(*[a.format(**values) for a in argv], cwd=tmp_path)
    assert result.code == code, result
    assert result.out == "", result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert words in lines[0], lines[0]
    assert "Traceback" not in result.err


async def test_without_anything_to_talk_to_the_command_says_what_to_give(tmp_path: Path) -> None:
    result = await claimd("jobs", cwd=tmp_path)
    assert (result.code, result.out) == (2, "")
    assert result.err.strip() == (
        "error: no claimd to talk to: give --config, --database-url "
        "or --url (or run `claimd dev` in this directory; for a `claimd dev --data-dir DIR`, "
        "give --data-dir DIR)"
    )


async def test_json_output_parses_and_times_are_read_in_the_jobs_zone(
    seeded: dict[str, str],
) -> None:
    db = ["--database-url", seeded["db"], "--json"]
    jobs = json.loads((await claimd("jobs", *db)).out)
    nightly = next(j for j in jobs if j["name"] == "nightly")
    assert (nightly["timezone"], nightly["paused"]) == ("Europe/Berlin", False)
    assert nightly["last_outcome"]["state"] == "succeeded"

    # 02:00 on 1 December is read in Berlin (+01:00): 01:00 UTC.
    trig = await claimd("trigger", "nightly", "--at", "2026-12-01 02:00", *db)
    assert trig.code == 0, trig
    triggered = json.loads(trig.out)
    assert triggered["scheduled_at"] == "2026-12-01T01:00:00+00:00"
    assert triggered["scheduled_instant"] is True
    assert "a scheduled instant of nightly" in triggered["message"], triggered
    run = json.loads((await claimd("show", triggered["run_id"], *db)).out)
    assert (run["scheduled_local"], run["trigger"]) == ("2026-12-01T02:00:00+01:00", "manual")
    # `claimd show JOB`: the job's latest run in one step (no UUID to copy).
    latest = json.loads((await claimd("show", "nightly", *db)).out)
    newest = json.loads((await claimd("runs", "nightly", "--limit", "1", *db)).out)["runs"][0]
    assert latest["id"] == newest["id"]
    assert "attempts" in latest

    page = json.loads((await claimd("runs", "nightly", "--since", "2026-11-30", *db)).out)
    assert [r["id"] for r in page["runs"]] == [triggered["run_id"]]
    first = json.loads((await claimd("runs", "nightly", "--limit", "1", *db)).out)
    rest = json.loads(
        (await claimd("runs", "nightly", "--limit", "1", "--cursor", first["next_cursor"], *db)).out
    )
    assert [r["id"] for r in first["runs"] + rest["runs"]] == [triggered["run_id"], seeded["run"]]
    assert rest["next_cursor"] is None
    audit = await claimd(
        "audit", "nightly", "--from", "2026-01-01", "--to", "2026-01-01 23:00", *db
    )
    assert audit.code == 0, audit
    assert json.loads(audit.out)["summary"]["complete"] is True
    # --at: one instant, the same answer as a range of one.
    one = await claimd("audit", "nightly", "--at", "2026-12-01 02:00", *db)
    assert one.code == 1, one  # its run is pending: not complete yet
    entries = json.loads(one.out)["entries"]
    assert [(e["scheduled_at"], e["run"]["id"]) for e in entries] == [
        ("2026-12-01T01:00:00+00:00", triggered["run_id"])
    ], entries
    cancelled = json.loads((await claimd("cancel", triggered["run_id"], *db)).out)
    assert cancelled["action"] == "cancel"
    acts = json.loads((await claimd("actions", "--job", "nightly", *db)).out)
    assert [a["action"] for a in acts] == ["cancel", "trigger"]
    everything = json.loads((await claimd("actions", *db)).out)
    assert [(a["action"], a["via"], a["ok"]) for a in everything] == [
        ("cancel", "cli", True),
        ("trigger", "cli", True),
    ]
    assert everything[0]["actor"]  # the OS user


async def test_a_refused_trigger_adds_nothing_and_is_recorded_and_its_answer_says_what_it_ran(
    seeded: dict[str, str], store: PostgresRunStore
) -> None:
    """A future --at is refused with the reason and adds no row (the slot stays the schedule's).

    A past instant the schedule does not name is an extra run, and the answer says so.
    """
    db = ["--database-url", seeded["db"]]
    refused = await claimd("trigger", "nightly", "--at", TOMORROW_0200, *db)
    assert (refused.code, refused.out) == (2, ""), refused
    assert "own run of it would never happen" in refused.err, refused.err
    assert await store.pool.fetchval("SELECT count(*) FROM job_runs WHERE trigger = 'manual'") == 0
    recorded = await store.pool.fetchrow("SELECT ok, result FROM operator_actions")
    assert recorded is not None
    assert recorded["ok"] is False
    assert "is later than now" in recorded["result"]

    extra = await claimd("trigger", "nightly", "--at", "2026-01-01 02:30", *db)
    assert extra.code == 0, extra
    assert "not an instant of nightly's schedule: an extra run" in extra.out, extra.out
    again = await claimd("trigger", "nightly", "--at", "2026-01-01 02:00", *db)
    assert again.code == 3, again
    assert "(a scheduled instant of nightly); nothing added" in again.err, again.err


async def test_commands_find_a_running_claimd_dev_of_their_directory(
    seeded: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / ".claimd"
    data.mkdir()
    # What `claimd dev` writes (tests/e2e/test_cli.py runs the real one), for a live process.
    (data / ENDPOINTS_FILE).write_text(
        json.dumps(
            {"pid": os.getpid(), "database_url": seeded["db"], "nats_url": "", "http_url": None}
        )
    )
    result = await claimd("jobs", "--json", cwd=tmp_path)
    assert result.code == 0, result
    assert {j["name"] for j in json.loads(result.out)} == {"nightly", "held"}

    (data / ENDPOINTS_FILE).write_text(
        json.dumps(
            {
                "pid": await _dead_pid(),
                "database_url": seeded["db"],
                "nats_url": "",
                "http_url": None,
            }
        )
    )
    stale = await claimd("jobs", cwd=tmp_path)
    assert stale.code == 4
    assert "is not running" in stale.err
    assert len(stale.err.strip().splitlines()) == 1


async def test_a_real_claimd_dev_is_found_through_its_data_folder(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    config = write_config(
        tmp_path / "dev.toml",
        http="127.0.0.1:0",
        claim_interval="100ms",
        materialize_interval="500ms",
        jobs=effect_job("tick", tmp_path / "effects.txt"),
    )
    data_dir = short_data_dir()
    seen: list[Result] = []
    recorded: list[str | None] = []

    async def operate() -> None:
        # No URL, no config: what `claimd dev` wrote in its data folder is enough
        # (the folder is ./.claimd by default; the test's is elsewhere, named here).
        seen.append(await claimd("jobs", "--json", "--data-dir", str(data_dir), cwd=tmp_path))
        recorded.append(json.loads((data_dir / ENDPOINTS_FILE).read_text())["http_url"])
        # A reload of the unchanged file changes nothing, settings included: the
        # file is reread with the embedded servers' URLs dev started with.
        pid_file = ["--pid-file", str(tmp_path / "dev.pid")]
        seen.append(await claimd("reload", *pid_file, "--data-dir", str(data_dir), "--json"))

    try:
        dev = await dev_session(
            spawn,
            data_dir,
            free_port(),
            "--config",
            str(config),
            "--pid-file",
            str(tmp_path / "dev.pid"),
            while_running=operate,
        )
    finally:
        stop_embedded_postgres(data_dir)
    assert seen[1].code == 0, seen[1]
    assert json.loads(seen[1].out)["settings_not_applied"] == []
    assert not [e for e in dev.logs() if "settings take effect" in str(e.get("event"))]
    assert f"  operate      claimd jobs --data-dir {data_dir}" in dev.stderr()
    assert seen[0].code == 0, seen[0]
    (job,) = json.loads(seen[0].out)
    assert job["name"] == "tick"
    assert job["last_success"] is not None
    # http = 127.0.0.1:0: the port the replica bound is recorded, not 0.
    assert recorded[0] is not None
    assert recorded[0].startswith("http://127.0.0.1:"), recorded
    assert not recorded[0].endswith(":0"), recorded
    assert not (data_dir / ENDPOINTS_FILE).exists()  # removed when claimd dev stopped


async def test_reload_reports_the_replicas_verdict(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    job = '[jobs.tick]\nevery = "1s"\nrun = { shell = ["/bin/true"] }\n'
    config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, job)
    pid_file = tmp_path / "claimd.pid"
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file))

    async def started() -> bool:
        assert replica.returncode() is None, replica.stderr()[-2000:]
        return bool(replica.events("replica started"))

    await eventually(started, timeout=30, what="the replica to start")
    db = ["--database-url", schema_url, "--pid-file", str(pid_file)]

    good = await claimd("reload", *db)
    assert (good.code, good.out.strip()) == (
        0,
        f"process {replica.pid}: reloaded: jobs 0 added, 0 changed, 0 removed",
    ), good
    # --json: one object saying what the reload did.
    config.write_text(config.read_text() + job.replace("tick", "tock"))
    added = await claimd("reload", *db, "--json")
    assert added.code == 0, added
    verdict = json.loads(added.out)
    assert (verdict["ok"], verdict["pid"]) == (True, replica.pid)
    assert verdict["added"] == {"count": 1, "names": ["tock"]}
    assert verdict["changed"]["count"] == verdict["removed"]["count"] == 0
    assert verdict["errors"] == {"count": 0, "messages": []}
    # The replica rereads its own file: broken, it refuses, and the command prints
    # each error on its own line.
    broken = config.read_text().replace('every = "1s"', 'every = "soon"', 2)
    config.write_text(broken)
    refused = await claimd("reload", *db)
    assert refused.code == 1, refused
    lines = refused.err.strip().splitlines()
    prefix = f"error: process {replica.pid}: refused: the file has 2 errors; jobs unchanged: "
    assert len(lines) == 2, lines
    assert all(line.startswith(prefix) for line in lines), lines
    assert sorted(line.split(": job ", 1)[1].split(":")[0] for line in lines) == [
        "'tick'",
        "'tock'",
    ], lines
    assert all("field 'every': 'soon' is not a duration" in line for line in lines), lines
    refused_json = await claimd("reload", *db, "--json")
    assert refused_json.code == 1, refused_json
    verdict = json.loads(refused_json.out)
    assert verdict["ok"] is False
    assert verdict["errors"]["count"] == 2
    assert verdict["rejected"] == {"count": 2, "names": ["tick", "tock"]}
    # Checked first with --config, a broken file is not even signalled.
    checked = await claimd("reload", *db, "--config", str(config))
    assert checked.code == 2
    assert "would refuse this file" in checked.err
    assert "field 'every'" in checked.err
    # A changed [claimd] setting is not applied by a reload: the text says so too
    # (was only in --json), on stderr, after the verdict line.
    fixed = broken.replace('every = "soon"', 'every = "1s"')
    assert "claim_interval" in fixed
    config.write_text(fixed.replace('"100ms"', '"200ms"', 1))
    settings = await claimd("reload", *db)
    assert settings.code == 0, settings
    assert settings.out.startswith(f"process {replica.pid}: reloaded: "), settings
    assert (
        f"warning: process {replica.pid}: [claimd] settings changed but not applied until "
        "the replica restarts: claim_interval" in settings.err
    ), settings


async def test_trigger_wait_follows_the_run_to_its_end(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    """`claimd trigger JOB --wait`: one step from "run it now" to its verdict and output."""
    jobs = (
        '[jobs.ok]\ncron = "0 0 1 1 *"\nrun = { shell = ["/bin/echo", "all good"] }\n\n'
        '[jobs.bad]\ncron = "0 0 1 1 *"\nmax_attempts = 1\n'
        'run = { shell = ["/bin/sh", "-c", "echo broken >&2; exit 3"] }\n'
    )
    config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
    replica = spawn("run", "--config", str(config))

    async def started() -> bool:
        assert replica.returncode() is None, replica.stderr()[-2000:]
        return bool(replica.events("replica started"))

    await eventually(started, timeout=30, what="the replica to start")
    db = ["--database-url", schema_url]
    good = await claimd("trigger", "ok", "--wait", *db)
    assert good.code == 0, good
    assert "succeeded" in good.out, good.out
    assert "all good" in good.out, good.out  # its output tail, in the same step
    assert good.err.strip(), good  # the trigger's own answer comes first, on stderr
    failed = await claimd("trigger", "bad", "--wait", "--json", *db)
    assert failed.code == 1, failed
    run = json.loads(failed.out)
    assert (run["state"], run["job"]) == ("failed", "bad"), run
    assert "broken" in (run["output_tail"] or ""), run

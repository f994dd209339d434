"""Helpers for the end-to-end tests: the real `claimd` command in subprocesses.

Output goes to files (a pipe nobody reads fills up and blocks the child); the
tests poll those files and the database with deadlines, never sleep to order
events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil


def claimd_command() -> list[str]:
    """The installed console script, else the module the script points at."""
    found = shutil.which("claimd")
    if found is None:
        beside = Path(sys.executable).parent / "claimd"
        found = str(beside) if beside.exists() else None
    return [found] if found else [sys.executable, "-m", "actors.cli"]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no server overrides leaking in from ours.

    (Faults cannot leak: `claimd` has no fault switch; the chaos harness's broken
    builds have an entry point of their own, tests/chaos/broken_replica.py.)
    """
    env = {
        k: v for k, v in os.environ.items() if k not in ("CLAIMD_DATABASE_URL", "CLAIMD_NATS_URL")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def port_is_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class ClaimdProcess:
    """One `claimd` subprocess with its stdout and stderr in files."""

    args: list[str]
    workdir: Path
    label: str
    env: dict[str, str] = field(default_factory=child_env)
    proc: subprocess.Popen[bytes] | None = None
    descendants: dict[int, psutil.Process] = field(default_factory=dict)
    # The child's file limit (RLIMIT_NOFILE, soft and hard), as `prlimit --nofile` sets it.
    max_files: int | None = None

    @property
    def stdout_path(self) -> Path:
        return self.workdir / f"{self.label}.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / f"{self.label}.stderr"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ClaimdProcess:
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [*claimd_command(), *self.args],
                stdout=out,
                stderr=err,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        if self.max_files:
            # prlimit(2) on the child, as `prlimit --pid` does: Popen returns once the
            # child has exec'd, before it opened more than its interpreter's files (no
            # preexec_fn: not safe in a process with threads).
            limit = (self.max_files, self.max_files)
            psutil.Process(self.proc.pid).rlimit(psutil.RLIMIT_NOFILE, limit)
        return self

    def returncode(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def logs(self) -> list[dict[str, Any]]:
        """The JSON log lines on stderr (other lines, e.g. from pgserver, are ignored)."""
        events = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    events.append(json.loads(line))
        return events

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def remember_descendants(self) -> None:
        """Note the children (e.g. an embedded nats-server) so teardown can end them by id."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                self.descendants[child.pid] = child

    def terminate(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> int:
        """Wait for the exit without blocking the event loop; fail after ``timeout``."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while (code := self.proc.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.label} still running {timeout}s after SIGTERM; "
                    f"stderr tail:\n{self.stderr()[-3000:]}"
                )
            await asyncio.sleep(0.05)
        return code

    def kill(self) -> None:
        """Teardown: SIGKILL whatever of this process and its noted children still runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for child in self.descendants.values():
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()


def http_port_of(process: ClaimdProcess) -> int | None:
    """The port the replica's HTTP server bound, from its 'replica started' log line."""
    for event in process.events("replica started"):
        _, _, port = str(event.get("http", "")).rpartition(":")
        if port.isdigit():
            return int(port)
    return None


def scrape_metrics(port: int) -> dict[str, float]:
    """Unlabelled and labelled samples of /metrics, keyed by their full sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


def metric_total(samples: dict[str, float], name: str) -> float:
    """The sum of a metric over its labels."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    """Poll ``check`` until it holds; fail after a generous deadline."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def write_config(path: Path, *, jobs: str, **settings: str | int) -> Path:
    """A config file: the [claimd] table from ``settings``, then the jobs TOML."""
    lines = ["[claimd]"]
    for key, value in settings.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n\n" + jobs)
    return path


def effect_job(name: str, effects: Path, every: str = "1s", extra: str = "") -> str:
    """A job whose every execution appends ``job run_id scheduled_at`` to ``effects``."""
    command = f'echo "$CLAIMD_JOB $CLAIMD_RUN_ID $CLAIMD_SCHEDULED_AT" >> {effects}'
    return (
        f'[jobs.{name}]\nevery = {json.dumps(every)}\ntimeout = "10s"\n{extra}'
        f"run = {{ shell = {json.dumps(command)}, use_shell = true }}\n\n"
    )


@dataclass(frozen=True)
class Effect:
    job: str
    run_id: str
    scheduled_at: datetime


def read_effects(path: Path) -> list[Effect]:
    if not path.exists():
        return []
    effects = []
    for line in path.read_text().splitlines():
        job, run_id, at = line.split()
        effects.append(Effect(job, run_id, datetime.fromisoformat(at)))
    return effects


@dataclass
class JobFigures:
    """What one job's runs look like after a test window."""

    job: str
    first: datetime
    last: datetime
    succeeded: int
    executions: int
    duplicate_executions: int
    workers: dict[str, int]

    @property
    def window_s(self) -> float:
        return (self.last - self.first).total_seconds() + 1

    @property
    def runs_per_second(self) -> float:
        return self.succeeded / self.window_s


async def check_effectively_once(
    schema_url: str, job: str, effects: list[Effect], every: timedelta = timedelta(seconds=1)
) -> JobFigures:
    """Assert: every due instant in [first effect, last effect] is one succeeded row,
    every succeeded run was executed once, and every execution belongs to a succeeded run."""
    mine = [e for e in effects if e.job == job]
    assert mine, f"job {job!r} never executed"
    ids = [e.run_id for e in mine]
    duplicates = len(ids) - len(set(ids))
    first = min(e.scheduled_at for e in mine)
    last = max(e.scheduled_at for e in mine)
    conn = await asyncpg.connect(schema_url)
    try:
        rows = await conn.fetch(
            "SELECT r.id::text AS id, r.scheduled_at, r.state FROM job_runs r "
            "JOIN jobs j ON j.id = r.job_id WHERE j.name = $1 "
            "AND r.scheduled_at BETWEEN $2 AND $3 ORDER BY r.scheduled_at",
            job,
            first,
            last,
        )
        succeeded = await conn.fetch(
            "SELECT r.id::text AS id, r.scheduled_at FROM job_runs r JOIN jobs j "
            "ON j.id = r.job_id WHERE j.name = $1 AND r.state = 'succeeded'",
            job,
        )
        attempts = await conn.fetch(
            "SELECT a.run_id::text AS run_id, a.outcome, a.worker FROM job_run_attempts a "
            "JOIN job_runs r ON r.id = a.run_id JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = $1",
            job,
        )
    finally:
        await conn.close()

    expected = []
    instant = first
    while instant <= last:
        expected.append(instant)
        instant += every
    got = [r["scheduled_at"] for r in rows]
    missing = sorted(set(expected) - set(got))
    assert got == expected, f"{job}: due instants missing {missing[:5]} or doubled"
    not_done = [
        (r["scheduled_at"].isoformat(), r["state"]) for r in rows if r["state"] != "succeeded"
    ]
    assert not_done == [], f"{job}: runs in the window not succeeded: {not_done[:5]}"
    assert duplicates == 0, f"{job}: {duplicates} run ids executed more than once"
    by_id = {r["id"]: r["scheduled_at"] for r in succeeded}
    assert set(by_id) == set(ids), (
        f"{job}: succeeded but never executed {sorted(set(by_id) - set(ids))[:5]}; "
        f"executed but not succeeded {sorted(set(ids) - set(by_id))[:5]}"
    )
    assert all(by_id[e.run_id] == e.scheduled_at for e in mine), "run handed the wrong instant"
    per_run: dict[str, int] = {}
    workers: dict[str, int] = {}
    for a in attempts:
        per_run[a["run_id"]] = per_run.get(a["run_id"], 0) + 1
        workers[a["worker"]] = workers.get(a["worker"], 0) + 1
    assert per_run == dict.fromkeys(by_id, 1), f"{job}: attempts per run are not one each"
    assert {a["outcome"] for a in attempts} == {"succeeded"}
    return JobFigures(
        job=job,
        first=first,
        last=last,
        succeeded=len(rows),
        executions=len(ids),
        duplicate_executions=duplicates,
        workers=workers,
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


async def query(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """One statement on a connection of its own (the test's view of the database)."""
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def db_now(url: str) -> datetime:
    """The database's clock, the one every instant is judged on."""
    now: datetime = (await query(url, "SELECT now() AS now"))[0]["now"]
    return now

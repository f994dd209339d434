"""Live output through the real `claimd`: `claimd logs -f` follows a running run's lines
as they are printed, through the API of the replica running it and of another one (the
job waits for the test to see each line before printing the next, so every line is
seen while the job still runs), and a job that floods 100 MB
leaves the replica's memory within a bound while a follower is attached.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.e2e.helpers import ClaimdProcess, child_env, claimd_command, eventually, http_port_of
from tests.e2e.test_cli import run_config, spawn
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
__all__ = ["spawn"]  # the fixture, shared with test_cli

LINE_DEADLINE_S = 15.0  # a generous deadline per line; the relay flushes every 0.1 s
# The replica's RSS may grow by this much while a job prints 100 MB (a test setting).
RSS_BOUND = 64 * 1024 * 1024
FLOOD_BYTES = 100_000_000
# A stopping replica closes its streams at once; aiohttp alone would wait 60 s for them.
STOP_DEADLINE_S = 30.0


def stepped_job(gate: Path) -> str:
    """Prints line-1..3, each after the test has created go-<previous> in ``gate``."""
    script = (
        "for i in 1 2 3; do echo line-$i; "
        f'while [ ! -e "{gate}/go-$i" ]; do sleep 0.02; done; done; echo all-done'
    )
    return (
        '[jobs.stepped]\ncron = "0 0 1 1 *"\ntimeout = "2m"\nmax_attempts = 1\n'
        f"run = {{ shell = {json.dumps(['/bin/sh', '-c', script])} }}\n"
    )


async def started(replica: ClaimdProcess) -> int:
    async def up() -> bool:
        assert replica.returncode() is None, replica.stderr()[-2000:]
        return http_port_of(replica) is not None

    await eventually(up, timeout=60, what="the replica to start")
    port = http_port_of(replica)
    assert port is not None
    return port


async def trigger(job: str, schema_url: str) -> str:
    done = await claimd("trigger", job, "--json", "--database-url", schema_url)
    assert done.code == 0, done
    return str(json.loads(done.out)["run_id"])


async def follower(target: str, url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *claimd_command(),
        "logs",
        "-f",
        target,
        "--url",
        url,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def next_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), LINE_DEADLINE_S)
    return line.decode().rstrip("\n")


async def test_logs_follow_shows_lines_while_the_job_runs(
    tmp_path: Path,
    schema_url: str,  # before spawn: its replicas are stopped before the schema goes
    spawn: Callable[..., ClaimdProcess],
    nats_url: str,
    deployment: str,
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    config = run_config(
        tmp_path / "claimd.toml", schema_url, nats_url, deployment, stepped_job(gate)
    )
    # The run executes on the worker; the scheduler's API relays it from there.
    scheduler = spawn("run", "--config", str(config), "--role", "scheduler", label="scheduler")
    worker = spawn("run", "--config", str(config), "--role", "worker", label="worker")
    url = f"http://127.0.0.1:{await started(scheduler)}"
    worker_url = f"http://127.0.0.1:{await started(worker)}"
    run_id = await trigger("stepped", schema_url)
    by_id = await follower(run_id, url)
    assert await next_line(by_id) == "line-1"
    # The run is running (it waits for go-1): a follower of the job finds it, and
    # starts with what the run printed so far (the executing replica's tail).
    by_job = await follower("stepped", worker_url)
    assert await next_line(by_job) == "line-1"
    for i in (1, 2):
        assert not (gate / f"go-{i + 1}").exists()
        (gate / f"go-{i}").touch()
        # Seen while the job still waits for go-{i+1}: live, not at the end.
        assert await next_line(by_id) == f"line-{i + 1}"
        assert await next_line(by_job) == f"line-{i + 1}"
    (gate / "go-3").touch()
    for proc in (by_id, by_job):
        assert await next_line(proc) == "all-done"
        out, err = await asyncio.wait_for(proc.communicate(), LINE_DEADLINE_S)
        assert proc.returncode == 0, err.decode()
        assert out == b"", out  # nothing after the run's end
        assert "run ended: succeeded" in err.decode()
    # Without -f: the kept tail, the same lines.
    kept = await claimd("logs", run_id, "--database-url", schema_url)
    assert kept.code == 0, kept
    assert "line-1\nline-2\nline-3\nall-done" in kept.out, kept.out
    # A finished run followed: its kept tail, then the end at once.
    again = await claimd("logs", "-f", run_id, "--url", url)
    assert again.code == 0, again
    assert again.out.startswith("line-1\nline-2\nline-3\nall-done"), again.out


async def test_a_flood_of_output_leaves_the_replica_within_its_memory_bound(
    tmp_path: Path,
    schema_url: str,  # before spawn: its replicas are stopped before the schema goes
    spawn: Callable[..., ClaimdProcess],
    nats_url: str,
    deployment: str,
) -> None:
    gate = tmp_path / "go"
    script = (
        f'while [ ! -e "{gate}" ]; do sleep 0.02; done; '
        f"yes 'a line of the flood, printed as fast as the pipe takes it' | head -c {FLOOD_BYTES}"
    )
    job = (
        '[jobs.flood]\ncron = "0 0 1 1 *"\ntimeout = "2m"\nmax_attempts = 1\n'
        f"run = {{ shell = {json.dumps(['/bin/sh', '-c', script])} }}\n"
    )
    config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, job)
    replica = spawn("run", "--config", str(config))
    port = await started(replica)
    process = psutil.Process(replica.pid)
    run_id = await trigger("flood", schema_url)
    follow = await follower(run_id, f"http://127.0.0.1:{port}")

    async def running() -> bool:
        found = await claimd("show", run_id, "--json", "--database-url", schema_url)
        return json.loads(found.out)["state"] == "running"

    await eventually(running, timeout=60, what="the flood job to start", interval=0.2)
    baseline = process.memory_info().rss
    peak = baseline
    gate.touch()  # the flood begins once the baseline is taken

    async def finished() -> bool:
        nonlocal peak
        peak = max(peak, process.memory_info().rss)
        found = await claimd("show", run_id, "--json", "--database-url", schema_url)
        return json.loads(found.out)["state"] == "succeeded"

    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, process.memory_info().rss)
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    started_at = time.monotonic()
    await eventually(finished, timeout=120, what="the flood to end", interval=0.5)
    sampling = False
    await sampler
    out, err = await asyncio.wait_for(follow.communicate(), 60)
    assert follow.returncode == 0, err.decode()[-2000:]
    assert peak - baseline < RSS_BOUND, (
        f"RSS grew {(peak - baseline) / 2**20:.1f} MiB (bound {RSS_BOUND / 2**20:.0f} MiB) "
        f"over {time.monotonic() - started_at:.1f} s"
    )
    # The follower got part of it, and was told the rest was dropped.
    assert b"bytes dropped" in out, out[-500:]
    assert len(out) < FLOOD_BYTES // 4, len(out)


async def test_an_open_stream_does_not_hold_the_replica_at_its_stop(
    tmp_path: Path,
    schema_url: str,  # before spawn: its replicas are stopped before the schema goes
    spawn: Callable[..., ClaimdProcess],
    nats_url: str,
    deployment: str,
) -> None:
    """SIGTERM to a replica whose API is relaying a run that goes on: it stops well
    within aiohttp's own 60 s wait for open answers, and the follower is told."""
    gate = tmp_path / "gate"
    gate.mkdir()
    config = run_config(
        tmp_path / "claimd.toml", schema_url, nats_url, deployment, stepped_job(gate)
    )
    scheduler = spawn("run", "--config", str(config), "--role", "scheduler", label="scheduler")
    worker = spawn("run", "--config", str(config), "--role", "worker", label="worker")
    url = f"http://127.0.0.1:{await started(scheduler)}"
    await started(worker)
    run_id = await trigger("stepped", schema_url)
    follow = await follower(run_id, url)
    assert await next_line(follow) == "line-1"
    scheduler.terminate()
    assert await scheduler.wait(STOP_DEADLINE_S) == 0, scheduler.stderr()[-2000:]
    # The HTTP server closed in time: the stream did not have to be abandoned.
    assert not scheduler.events("http server did not close in time; abandoned")
    _, err = await asyncio.wait_for(follow.communicate(), LINE_DEADLINE_S)
    assert follow.returncode == 1
    assert "closed before the run ended" in err.decode(), err
    assert "reconnect" in err.decode(), err  # told why
    for i in (1, 2, 3):
        (gate / f"go-{i}").touch()  # the run ends on the worker

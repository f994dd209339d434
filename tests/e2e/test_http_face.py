"""The HTTP face of a real `claimd run` under hostile clients, and the commands' token.

A replica whose file limit is 1,024 (as `prlimit --nofile=1024` sets it)
meets 1,100 connections that each send half a request and then nothing:
/healthz still answers (long before the header timeout) and every job keeps
running. Before the connection cap the flood took every file descriptor:
accept() failed with EMFILE, the health check could not connect, and the
jobs' shells could not get their pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.e2e.helpers import (
    ClaimdProcess,
    child_env,
    effect_job,
    eventually,
    http_port_of,
    read_effects,
    write_config,
)
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FILE_LIMIT = 1024
FLOOD = 1100
JOBS = ("alpha", "beta", "gamma")
READ = "a-read-token-for-the-e2e-test-0123456"
OPERATE = "an-operate-token-for-the-e2e-test-012"
# The flood must be survived by the cap, not waited out: the header timeout is
# longer than every deadline of the test after the flood.
HEADER_TIMEOUT_S = 45


def _enough_files_here() -> None:
    """This test process holds the flood's 1,100 sockets: raise its own soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FLOOD + 400
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.fail(f"the test needs {wanted} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def _half_request(port: int) -> asyncio.StreamWriter | None:
    """A connection that sends half a request's headers, then nothing."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, TimeoutError):
        return None
    with contextlib.suppress(OSError):
        writer.write(b"GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return writer


async def _flood(port: int) -> list[asyncio.StreamWriter]:
    gate = asyncio.Semaphore(200)

    async def one() -> asyncio.StreamWriter | None:
        async with gate:
            return await _half_request(port)

    opened = await asyncio.gather(*(one() for _ in range(FLOOD)))
    return [w for w in opened if w is not None]


async def _healthz(port: int) -> int | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            return response.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def test_a_flood_of_half_requests_at_a_1024_file_limit_leaves_healthz_and_the_jobs(
    schema_url: str, nats_url: str, deployment: str, tmp_path: Path
) -> None:
    _enough_files_here()
    effects = tmp_path / "effects"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"viewer {READ} read\nops {OPERATE} operate\n")
    config = write_config(
        tmp_path / "claimd.toml",
        jobs="".join(effect_job(name, effects) for name in JOBS),
        database_url=schema_url,
        nats_url=nats_url,
        deployment=deployment,
        http="127.0.0.1:0",
        claim_interval="100ms",
        materialize_interval="500ms",
        shutdown_grace="5s",
        http_header_timeout=f"{HEADER_TIMEOUT_S}s",
        api_token_file=str(tokens),
    )
    replica = ClaimdProcess(
        ["run", "--config", str(config)], tmp_path, "replica", max_files=FILE_LIMIT
    ).start()
    writers: list[asyncio.StreamWriter] = []
    try:
        assert psutil.Process(replica.pid).rlimit(psutil.RLIMIT_NOFILE) == (
            FILE_LIMIT,
            FILE_LIMIT,
        )

        def runs_of(job: str) -> int:
            return sum(1 for e in read_effects(effects) if e.job == job)

        async def running() -> bool:
            assert replica.returncode() is None, replica.stderr()[-2000:]
            return http_port_of(replica) is not None and all(runs_of(j) >= 1 for j in JOBS)

        await eventually(running, timeout=45, what="the replica running every job")
        port = http_port_of(replica)
        assert port is not None

        flood_began = time.monotonic()
        writers = await _flood(port)
        flooded = time.monotonic()
        before = {job: runs_of(job) for job in JOBS}

        async def healthy() -> bool:
            return await _healthz(port) == 200

        try:
            await eventually(healthy, timeout=15, what="/healthz answering during the flood")
        except AssertionError as exc:
            child = psutil.Process(replica.pid)
            raise AssertionError(
                f"{exc}; the replica holds {len(child.net_connections(kind='tcp'))} TCP "
                f"connections and {child.num_fds()} files; its stderr ends:\n"
                f"{replica.stderr()[-2000:]}"
            ) from None
        assert time.monotonic() - flood_began < HEADER_TIMEOUT_S  # not the timeout's doing

        async def jobs_go_on() -> bool:
            assert replica.returncode() is None, replica.stderr()[-2000:]
            return all(runs_of(job) >= before[job] + 3 for job in JOBS)

        await eventually(jobs_go_on, timeout=25, what="every job running during the flood")
        assert time.monotonic() - flooded < HEADER_TIMEOUT_S
        held = len(psutil.Process(replica.pid).net_connections(kind="tcp"))
        assert held < FILE_LIMIT // 2, held
        assert "Too many open files" not in replica.stderr()
        print(
            f"\n{len(writers)} of {FLOOD} half requests connected; the replica holds {held} "
            f"TCP connections; /healthz answered and every job ran 3 more times "
            f"{time.monotonic() - flooded:.1f}s after the flood"
        )
    finally:
        for writer in writers:
            writer.transport.abort()
        replica.terminate()
        with contextlib.suppress(AssertionError):
            await replica.wait(30)
        replica.kill()


async def test_the_commands_send_the_token_from_a_file_or_the_environment(
    schema_url: str, nats_url: str, deployment: str, tmp_path: Path
) -> None:
    """`--url` reads need a read token (from --token-file or CLAIMD_API_TOKEN), actions an
    operate one; `--token VALUE` (visible in ps) is gone."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"viewer {READ} read\nops {OPERATE} operate\n")
    config = write_config(
        tmp_path / "claimd.toml",
        jobs='[jobs.tick]\nevery = "1h"\nrun = { shell = ["/bin/true"] }\n',
        database_url=schema_url,
        nats_url=nats_url,
        deployment=deployment,
        http="127.0.0.1:0",
        shutdown_grace="5s",
        api_token_file=str(tokens),
    )
    replica = ClaimdProcess(["run", "--config", str(config)], tmp_path, "replica").start()
    try:

        async def serving() -> bool:
            assert replica.returncode() is None, replica.stderr()[-2000:]
            return http_port_of(replica) is not None

        await eventually(serving, timeout=45, what="the replica serving")
        url = ["--url", f"http://127.0.0.1:{http_port_of(replica)}"]
        read_file = tmp_path / "read-token"
        read_file.write_text(READ + "\n")

        refused = await claimd("jobs", *url)
        assert refused.code == 2, refused
        assert "HTTP 401" in refused.err, refused
        listed = await claimd("jobs", "--json", *url, "--token-file", str(read_file))
        assert listed.code == 0, listed
        assert [j["name"] for j in json.loads(listed.out)] == ["tick"]
        paused = await claimd("pause", "tick", *url, env=child_env(CLAIMD_API_TOKEN=READ))
        assert paused.code == 2, paused
        assert "HTTP 403" in paused.err, paused
        paused = await claimd("pause", "tick", *url, env=child_env(CLAIMD_API_TOKEN=OPERATE))
        assert paused.code == 0, paused
        gone = await claimd("jobs", *url, "--token", READ)
        assert gone.code == 2, gone
        assert "unrecognized arguments: --token" in gone.err, gone
        assert READ not in gone.err.replace(f"--token {READ}", ""), gone
    finally:
        replica.terminate()
        with contextlib.suppress(AssertionError):
            await replica.wait(30)
        replica.kill()

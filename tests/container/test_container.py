"""The container image, built and run for real with podman.

The base image is made from Debian's packages (docker/make-base-image.sh,
reused while its recipe is unchanged), the image by docker/build-image.sh from
docker/Dockerfile. A container then runs against the test servers (host
network, the test's own schema and stream) with a job every second, and is
judged by what an operator would see: its HEALTHCHECK turns healthy, the job's
runs are succeeded rows in the database, nothing it spawned is left a zombie
(tini is PID 1), and `podman stop` (SIGTERM) ends it with exit code 0.

Skipped, with the reason, where podman, mmdebstrap or root are missing or
podman cannot start a container on the machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
import yaml

from actors.adapters.embedded import free_port
from tests.e2e.helpers import eventually, write_config

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/claimd-base:bookworm"
IMAGE = "localhost/claimd:test"
# What podman needs to start containers on these machines (their rlimits
# cannot be raised inside the sandbox); harmless elsewhere.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
STOP_TIMEOUT_S = 30


def _run(
    args: list[str], *, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="module")
def podman() -> list[str]:
    """The podman command, with an OCI runtime that starts containers here; else skip.

    Makes the base image first (it is what the probe runs). crun cannot start
    containers under a hybrid cgroup hierarchy, so runc is tried after it.
    """
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install podman runc mmdebstrap)")
    if os.geteuid() != 0:
        pytest.skip("making the base image with mmdebstrap needs root")
    made = _run(
        [str(REPO / "docker" / "make-base-image.sh")],
        timeout=600,
        env={**os.environ, "CONTAINER_ENGINE": "podman"},
    )
    assert made.returncode == 0, f"make-base-image.sh failed:\n{made.stdout}\n{made.stderr}"
    candidates = [["podman"]]
    if shutil.which("runc") is not None:
        candidates.append(["podman", "--runtime", "runc"])
    errors = []
    for command in candidates:
        probe = _run([*command, "run", "--rm", *ULIMITS, BASE_IMAGE, "true"])
        if probe.returncode == 0:
            return command
        last = (probe.stderr.strip().splitlines() or ["no error text"])[-1]
        errors.append(f"{' '.join(command)}: {last}")
    pytest.skip("podman cannot start a container on this machine: " + "; ".join(errors))


@pytest.fixture(scope="module")
def image(podman: list[str]) -> str:
    """The claimd image, built by docker/build-image.sh (layers cached between runs)."""
    built = _run(
        [str(REPO / "docker" / "build-image.sh"), IMAGE],
        timeout=840,
        env={
            **os.environ,
            "CONTAINER_ENGINE": " ".join(podman),
            "CONTAINER_BUILD_FLAGS": " ".join(ULIMITS),
        },
    )
    assert built.returncode == 0, (
        f"build-image.sh failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    )
    return IMAGE


@pytest.fixture
def container_name(podman: list[str], deployment: str) -> Iterator[str]:
    """A container name of the test's own; the container is removed afterwards."""
    name = f"claimd-{deployment}"
    yield name
    _run([*podman, "rm", "--force", "--time", "0", name])


def _tcp_database(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host != "" and not host.startswith("/")


async def _succeeded(url: str, job: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = $1 AND r.state = 'succeeded'",
            job,
        )
        return count
    finally:
        await conn.close()


async def _podman(podman: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_run, [*podman, *args])


async def _zombies(podman: list[str], name: str) -> list[str]:
    """The processes in the container that exited and were never reaped."""
    listing = await _podman(
        podman, "exec", name, "/bin/sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null; true"
    )
    assert listing.returncode == 0, listing.stderr
    zombies = []
    for line in listing.stdout.splitlines():
        # pid (comm) state ...; comm may hold spaces, so split after the ')'.
        head, _, rest = line.rpartition(")")
        if rest.split()[:1] == ["Z"]:
            zombies.append(head + ")")
    return zombies


async def test_container_runs_jobs_turns_healthy_and_exits_0_on_sigterm(
    podman: list[str],
    image: str,
    container_name: str,
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
) -> None:
    if not _tcp_database(schema_url):
        pytest.skip(
            "the container reaches PostgreSQL over TCP only: set "
            "CLAIMD_TEST_DATABASE_URL to a TCP URL"
        )
    http = f"127.0.0.1:{free_port()}"
    # Every run leaves an orphan behind ((sleep 0 &) exits before its child):
    # only an init that reaps reparented children keeps them from piling up.
    config = write_config(
        tmp_path / "claimd.toml",
        deployment=deployment,
        shutdown_grace="10s",
        jobs='[jobs.tick]\nevery = "1s"\ntimeout = "10s"\n'
        'run = { shell = "(sleep 0 &); echo tick $CLAIMD_RUN_ID", use_shell = true }\n',
    )
    config.chmod(0o644)  # read by the image's non-root user
    started = await _podman(
        podman,
        "run",
        "--detach",
        "--name",
        container_name,
        "--network",
        "host",
        *ULIMITS,
        "--env",
        f"CLAIMD_DATABASE_URL={schema_url}",
        "--env",
        f"CLAIMD_NATS_URL={nats_url}",
        "--env",
        f"CLAIMD_HTTP={http}",
        "--volume",
        f"{config}:/etc/claimd/claimd.toml:ro",
        image,
    )
    assert started.returncode == 0, started.stderr

    async def logs() -> str:
        out = await _podman(podman, "logs", container_name)
        return out.stdout + out.stderr

    async def healthy() -> bool:
        # Runs the image's HEALTHCHECK now (no systemd timer runs it here).
        check = await _podman(podman, "healthcheck", "run", container_name)
        return check.returncode == 0

    try:
        await eventually(healthy, timeout=90, what="the HEALTHCHECK to pass", interval=0.5)
        status = await _podman(
            podman, "inspect", "--format", "{{.State.Health.Status}}", container_name
        )
        assert status.stdout.strip() == "healthy"

        async def three_succeeded() -> bool:
            return await _succeeded(schema_url, "tick") >= 3

        await eventually(three_succeeded, timeout=60, what="3 succeeded runs of tick")

        async def no_zombies() -> bool:
            return await _zombies(podman, container_name) == []

        await eventually(no_zombies, timeout=30, what="no unreaped process in the container")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; container log:\n{(await logs())[-6000:]}") from None

    stopped = await _podman(podman, "stop", "--time", str(STOP_TIMEOUT_S), container_name)
    assert stopped.returncode == 0, stopped.stderr
    state = await _podman(podman, "inspect", "--format", "{{.State.ExitCode}}", container_name)
    text = await logs()
    assert state.stdout.strip() == "0", f"exit code {state.stdout.strip()}; log:\n{text[-4000:]}"
    assert "replica stopped" in text


def test_image_runs_as_non_root_without_the_embedded_servers(podman: list[str], image: str) -> None:
    user = _run([*podman, "image", "inspect", "--format", "{{.Config.User}}", image])
    assert user.stdout.strip() == "10001:10001"
    health = _run([*podman, "image", "inspect", "--format", "{{.Config.Healthcheck.Test}}", image])
    assert "healthcheck.py" in health.stdout
    # HTTP is bound for a container (every interface), not to its own loopback.
    env = _run([*podman, "image", "inspect", "--format", "{{json .Config.Env}}", image])
    assert '"CLAIMD_HTTP=0.0.0.0:8780"' in env.stdout
    # `claimd dev` in the image: the embedded servers are not there, and it says
    # so in one line with exit code 2 (the console script itself, unmocked).
    dev = _run([*podman, "run", "--rm", "--no-healthcheck", *ULIMITS, image, "dev"])
    assert dev.returncode == 2, dev.stdout + dev.stderr
    lines = dev.stderr.strip().splitlines()
    assert len(lines) == 1, dev.stderr
    assert "claimd[embedded]" in lines[0]
    assert "pgserver" in lines[0]


def test_compose_file_is_valid_and_least_privileged() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    command = [compose, "--file", str(REPO / "docker" / "compose.yaml"), "config"]
    bare = {k: v for k, v in os.environ.items() if not k.endswith("_PASSWORD")}
    # No password, no stack: nothing falls back to a default credential.
    refused = _run([*command, "--quiet"], env=bare)
    assert refused.returncode != 0
    assert "POSTGRES_PASSWORD" in refused.stderr, refused.stderr
    passwords = {
        "POSTGRES_PASSWORD": "su-pw",
        "CLAIMD_DB_PASSWORD": "db-pw",
        "NATS_PASSWORD": "n-pw",
    }
    checked = _run(command, env={**bare, **passwords})
    assert checked.returncode == 0, checked.stderr
    services = yaml.safe_load(checked.stdout)["services"]
    for name, service in services.items():
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert service.get("mem_limit"), name
    claimd = services["claimd"]["environment"]
    assert claimd["CLAIMD_DATABASE_URL"] == "postgresql://claimd:db-pw@postgres/claimd"
    assert claimd["CLAIMD_NATS_URL"] == "nats://claimd:n-pw@nats:4222"
    ports = [
        str(p.get("host_ip") if isinstance(p, dict) else p) for p in services["prometheus"]["ports"]
    ]
    assert ports, "prometheus publishes no port"
    assert all(p.startswith("127.0.0.1") for p in ports), ports

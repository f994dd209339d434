"""The image run the way deploy/kubernetes runs it: read-only, non-root, no capabilities.

No cluster here, so podman plays the kubelet from the rendered production
Deployment (tests/kustomize_lite.py): its user and group, a read-only root
filesystem, every capability dropped, no privilege escalation, a tmpfs for each
emptyDir, the ConfigMap's claimd.toml as the directory /etc/claimd, its
environment with the Secret's values (the URLs pointed at the test servers,
HTTP on a free loopback port of the host network). The container must answer
the readiness and liveness probes' paths, run a shell job that writes to /tmp,
reload its file on SIGHUP sent to PID 1, and stop within the pod's
terminationGracePeriodSeconds with exit code 0.

Seccomp is left to podman's default profile (the pod asks RuntimeDefault).
"""

from __future__ import annotations

import asyncio
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from actors.adapters.embedded import free_port
from tests.container.test_container import (
    ULIMITS,
    _podman,
    _succeeded,
    _tcp_database,
    container_name,
    image,
    podman,
)
from tests.e2e.helpers import eventually
from tests.kustomize_lite import render

__all__ = ["container_name", "image", "podman"]  # fixtures

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def pod_flags(
    deployment: dict[str, Any], config_dir: Path, env: dict[str, str]
) -> tuple[list[str], list[str], int]:
    """podman run flags for the Deployment's pod, its args, and its grace period."""
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    pod_security, security = spec["securityContext"], container["securityContext"]
    flags = ["--user", f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"]
    if security["readOnlyRootFilesystem"]:
        # Without podman's own tmpfs on /tmp, /var/tmp and /run: a pod has only its emptyDirs.
        flags += ["--read-only", "--read-only-tmpfs=false"]
    flags += [f"--cap-drop={c}" for c in security["capabilities"]["drop"]]
    if security["allowPrivilegeEscalation"] is False:
        flags += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777"]
        elif "configMap" in volume:
            flags += ["--volume", f"{config_dir}:{mount['mountPath']}:ro"]
        else:
            raise AssertionError(f"no podman equivalent for volume {volume}")
    for name, value in env.items():
        flags += ["--env", f"{name}={value}"]
    return flags, container["args"], spec["terminationGracePeriodSeconds"]


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def test_the_image_runs_as_the_kubernetes_pod_does(
    podman: list[str],
    image: str,
    container_name: str,
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
) -> None:
    if not _tcp_database(schema_url):
        pytest.skip("the container reaches PostgreSQL over TCP only")
    kinds = {r["kind"]: r for r in render(KUBE / "overlays/production")}
    manifest, config_map, secret = kinds["Deployment"], kinds["ConfigMap"], kinds["Secret"]
    (container,) = manifest["spec"]["template"]["spec"]["containers"]

    # The ConfigMap's [claimd] table as shipped, the test's stream and a quick job
    # that needs a writable /tmp.
    shipped = tomllib.loads(config_map["data"]["claimd.toml"])["claimd"]
    lines = [f"{k} = {v!r}".replace("'", '"') for k, v in shipped.items()]
    lines.append(f'deployment = "{deployment}"')
    config_dir = tmp_path / "etc-claimd"
    config_dir.mkdir()
    config_dir.chmod(0o755)
    (config_dir / "claimd.toml").write_text(
        "[claimd]\n" + "\n".join(lines) + '\n\n[jobs.tick]\nevery = "1s"\ntimeout = "10s"\n'
        'run = { shell = "echo $CLAIMD_RUN_ID > /tmp/last && cat /tmp/last", use_shell = true }\n'
    )
    (config_dir / "claimd.toml").chmod(0o644)

    port = free_port()
    env: dict[str, str] = {}
    for var in container["env"]:
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        env[var["name"]] = secret["stringData"][ref["key"]] if ref else var["value"]
    env |= {
        "CLAIMD_API_TOKEN": "0123456789abcdef0123456789abcdef",  # the template's is refused
        "CLAIMD_DATABASE_URL": schema_url,
        "CLAIMD_NATS_URL": nats_url,
        "CLAIMD_HTTP": f"127.0.0.1:{port}",  # the host network: a free port, not 8780
    }
    flags, args, grace = pod_flags(manifest, config_dir, env)
    started = await _podman(
        podman,
        "run",
        "--detach",
        "--name",
        container_name,
        "--network",
        "host",
        *ULIMITS,
        *flags,
        image,
        *args,
    )
    assert started.returncode == 0, started.stderr

    async def logs() -> str:
        out = await _podman(podman, "logs", container_name)
        return out.stdout + out.stderr

    readiness = container["readinessProbe"]["httpGet"]["path"]
    liveness = container["livenessProbe"]["httpGet"]["path"]

    async def probes_pass() -> bool:
        statuses = await asyncio.gather(
            asyncio.to_thread(http_status, f"http://127.0.0.1:{port}{readiness}"),
            asyncio.to_thread(http_status, f"http://127.0.0.1:{port}{liveness}"),
        )
        return list(statuses) == [200, 200]

    async def three_succeeded() -> bool:
        return await _succeeded(schema_url, "tick") >= 3

    try:
        await eventually(probes_pass, timeout=90, what="/readyz and /healthz 200", interval=0.5)
        await eventually(three_succeeded, timeout=60, what="3 succeeded runs of tick")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; container log:\n{(await logs())[-6000:]}") from None

    # The root filesystem is read-only for the job's user too.
    denied = await _podman(podman, "exec", container_name, "/bin/sh", "-c", "touch /opt/x")
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stderr

    # A ConfigMap change reaches the replica by SIGHUP to PID 1 (tini forwards it),
    # as docs/kubernetes.md says to send it.
    hup = await _podman(podman, "exec", container_name, "/bin/sh", "-c", "kill -HUP 1")
    assert hup.returncode == 0, hup.stderr

    async def reloaded() -> bool:
        return '"event": "reloaded"' in await logs()

    await eventually(reloaded, timeout=30, what="the replica to reload on SIGHUP to PID 1")

    stopped = await _podman(podman, "stop", "--time", str(grace), container_name)
    assert stopped.returncode == 0, stopped.stderr
    state = await _podman(podman, "inspect", "--format", "{{.State.ExitCode}}", container_name)
    text = await logs()
    assert state.stdout.strip() == "0", f"exit code {state.stdout.strip()}; log:\n{text[-4000:]}"
    print(
        f"\n[pod] read-only, user 10001, caps dropped: probes 200, runs succeeded, "
        f"stopped within {grace} s with exit 0"
    )

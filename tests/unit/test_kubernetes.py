"""deploy/kubernetes: valid Kubernetes, and in agreement with what claimd serves and reads.

No cluster: each kustomization is rendered (tests/kustomize_lite.py, checked
against a real kustomize where one is installed) and every resource validated
against the Kubernetes JSON schemas of a current release (kubernetes-validate,
strict: an unknown field fails). The ServiceMonitor is a CRD those schemas do
not hold; its few fields are checked by hand. Then the agreement: the probes
ask for the routes claimd serves on the port it listens on (its settings read
from the ConfigMap's own claimd.toml with the Deployment's environment), every
variable is one claimd reads, the config path is the image's, and the grace
period covers claimd's bounded stop.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from actors.config import ConfigError, parse_config
from actors.config.settings import ENV_OVERRIDES
from actors.http.openapi.operations import BY_ID
from actors.replica.lifecycle import stop_bound
from tests.kustomize_lite import render

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BUILDS = ["base", "overlays/production", "overlays/production-servicemonitor"]
POD_LABELS = {"app.kubernetes.io/name": "claimd", "app.kubernetes.io/component": "scheduler"}
# Read by claimd's command line rather than the [claimd] table.
CLI_VARIABLES = {"CLAIMD_LOG_FORMAT"}


def by_kind(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [r["kind"] for r in resources]
    assert len(kinds) == len(set(kinds)), f"one of each kind expected: {kinds}"
    return {r["kind"]: r for r in resources}


def kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.parametrize("build", BUILDS)
def test_the_renderer_agrees_with_a_real_kustomize(build: str) -> None:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl installed")
    done = subprocess.run(
        [*command, str(KUBE / build)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr

    def key(r: dict[str, Any]) -> tuple[str, str]:
        return r["kind"], r["metadata"]["name"]

    real = sorted((d for d in yaml.safe_load_all(done.stdout) if d), key=key)
    assert sorted(render(KUBE / build), key=key) == real


@pytest.mark.parametrize("build", BUILDS)
def test_every_rendered_resource_is_valid_for_a_current_kubernetes(build: str) -> None:
    version = kubernetes_validate.latest_version()
    checked = []
    for resource in render(KUBE / build):
        if resource["kind"] == "ServiceMonitor":
            check_service_monitor(resource)
            continue
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{build}: {resource['kind']}: {exc}") from None
        checked.append(resource["kind"])
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= set(checked)
    print(f"\n[kubernetes {version}] {build}: {', '.join(sorted(checked))} valid (strict)")


def check_service_monitor(resource: dict[str, Any]) -> None:
    """The prometheus-operator fields used (its CRD is not in the Kubernetes schemas)."""
    assert resource["apiVersion"] == "monitoring.coreos.com/v1"
    spec = resource["spec"]
    assert set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector"}
    assert spec["selector"]["matchLabels"] == POD_LABELS
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["path"] == "/metrics" == BY_ID["metrics"].path
    for field in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"\d+(ms|s|m)", endpoint[field])


def test_a_validation_error_is_caught() -> None:
    """The validator refuses what a typo makes (so the test above can fail)."""
    deployment = by_kind(render(KUBE / "base"))["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def production() -> dict[str, dict[str, Any]]:
    return by_kind(render(KUBE / "overlays/production-servicemonitor"))


def test_the_production_install_is_highly_available_and_locked_down() -> None:
    kinds = production()
    deployment, pdb, service = kinds["Deployment"], kinds["PodDisruptionBudget"], kinds["Service"]
    assert {r["metadata"]["namespace"] for r in kinds.values()} == {"claimd"}
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]
    assert POD_LABELS.items() <= pod["metadata"]["labels"].items()
    # The Deployment, the PDB, the Service and the ServiceMonitor select the same pods.
    assert deployment["spec"]["selector"]["matchLabels"] == POD_LABELS
    assert pdb["spec"]["selector"]["matchLabels"] == POD_LABELS
    assert service["spec"]["selector"] == POD_LABELS
    assert pdb["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert container["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    assert container["image"] == "registry.example.com/claimd:0.1.0"


def dockerfile_command() -> list[str]:
    """The image's CMD (the JSON form) from docker/Dockerfile."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.MULTILINE)
    parsed: list[str] = yaml.safe_load(cmd)
    return parsed


# What an operator puts in the Secret's api-token (the template's is refused).
A_TOKEN = "0123456789abcdef0123456789abcdef"


def deployment_env(container: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    """The container's environment with the Secret's values filled in."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret[ref["key"]]
    return env


def test_the_secret_template_cannot_run_unfilled() -> None:
    """Its placeholder token is refused, so an unedited template never serves a known token."""
    kinds = production()
    (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = deployment_env(container, kinds["Secret"]["stringData"])
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        parse_config(kinds["ConfigMap"]["data"]["claimd.toml"], "claimd.toml", env)


def test_the_manifests_agree_with_what_claimd_serves_and_reads() -> None:
    kinds = production()
    deployment, config_map, secret = kinds["Deployment"], kinds["ConfigMap"], kinds["Secret"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]

    # The config path: the image's command, and the ConfigMap mounted where it reads.
    assert container["args"] == dockerfile_command()
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_path.name in config_map["data"]

    # claimd's settings as the pod has them: the ConfigMap's file, the pod's environment.
    refs = [v["valueFrom"]["secretKeyRef"] for v in container["env"] if "valueFrom" in v]
    assert {r["name"] for r in refs} == {secret["metadata"]["name"]}
    assert {r["key"] for r in refs} <= set(secret["stringData"])
    filled = {**secret["stringData"], "api-token": A_TOKEN}
    env = deployment_env(container, filled)
    loaded = parse_config(config_map["data"][config_path.name], str(config_path), env)
    assert loaded.errors == []
    settings = loaded.settings

    # Every variable is one claimd reads.
    readable = set(ENV_OVERRIDES.values()) | {settings.api_token_env} | CLI_VARIABLES
    assert set(env) - readable == set()
    assert settings.database_url == secret["stringData"]["database-url"]
    assert settings.nats_url == secret["stringData"]["nats-url"]
    assert settings.api_tokens == (("api", A_TOKEN, "operate"),)

    # The probes: claimd's own routes, on the port it listens on.
    (port,) = container["ports"]
    assert port["containerPort"] == settings.http_port
    assert settings.http_host == "0.0.0.0"  # reachable by the kubelet and the Service
    assert container["readinessProbe"]["httpGet"] == {
        "path": BY_ID["readyz"].path,
        "port": port["name"],
    }
    assert container["livenessProbe"]["httpGet"] == {
        "path": BY_ID["healthz"].path,
        "port": port["name"],
    }
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == port["name"]

    # The kubelet's SIGKILL comes after claimd's bounded stop, never before.
    bound = stop_bound(settings.shutdown_grace.total_seconds())
    assert spec["terminationGracePeriodSeconds"] >= bound
    print(
        f"\n[kubernetes] port {settings.http_port}, probes /readyz and /healthz, config "
        f"{config_path}, grace {spec['terminationGracePeriodSeconds']} s >= stop bound {bound} s"
    )

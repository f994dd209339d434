"""The shipped alert rules, checked by promtool and run by a real Prometheus against claimd.

- `promtool check rules` and `promtool test rules` on docker/alerts.yml and its
  unit tests (docker/alerts.test.yml).
- A real Prometheus (Debian's `prometheus` package), configured from
  docker/prometheus.yml pointed at a `claimd run` on loopback (1 s scrape and
  evaluation) with the shipped rules as they are: a counter read back through
  its query API equals the run history in SQL, carries the scrape's own `job`
  label beside `claimd_job` (no `exported_job`), and the failure alert fires
  for a job that always fails.
- The same with only the outage alert's `for:` shortened: "no replica reporting"
  clears while the replica answers and fires once it has stopped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from actors.adapters.embedded import free_port
from tests.e2e.helpers import ClaimdProcess, child_env, claimd_command, eventually, write_config
from tests.e2e.observe_helpers import http_get, spawn

__all__ = ["spawn"]  # fixture

DOCKER = Path(__file__).resolve().parents[2] / "docker"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NO_PROMTOOL = "promtool not installed (Debian: apt-get install prometheus)"

pytestmark = pytest.mark.timeout(150)


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_checks_the_shipped_rules() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(DOCKER / "alerts.yml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print("\n" + done.stdout.strip())


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_rule_unit_tests_pass() -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts.test.yml"],
        cwd=DOCKER,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print("\n" + done.stdout.strip())


def test_every_alert_has_a_unit_test_and_prometheus_loads_the_file_compose_mounts() -> None:
    rules = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((DOCKER / "alerts.test.yml").read_text())
    tested = {
        case["alertname"]
        for t in tests["tests"]
        for case in t["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert alerts - tested == set(), "alerts without a firing unit test"
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert "./alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts


# --- a real Prometheus --------------------------------------------------------------


def prometheus_config(path: Path, claimd_port: int, rules: Path) -> Path:
    """docker/prometheus.yml with its target on loopback, 1 s intervals, the shipped rules."""
    config: dict[str, Any] = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": "1s",
        "evaluation_interval": "1s",
    }
    config["rule_files"] = [str(rules)]
    (scrape,) = config["scrape_configs"]
    assert scrape["job_name"] == "claimd"
    scrape.pop("dns_sd_configs")
    scrape["scrape_interval"] = "1s"
    scrape["static_configs"] = [{"targets": [f"127.0.0.1:{claimd_port}"]}]
    path.write_text(yaml.safe_dump(config))
    return path


def shipped_rules(path: Path, waits: dict[str, str] | None = None) -> Path:
    """docker/alerts.yml as it ships, or with the `for:` of the alerts in ``waits`` replaced.

    Only the wait changes: a test cannot sit out a minute-long `for:`, but the
    expression, labels and annotations it proves are the shipped ones.
    """
    if not waits:
        shutil.copy(DOCKER / "alerts.yml", path)
        return path
    rules: dict[str, Any] = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    found = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in waits:
                rule["for"] = waits[rule["alert"]]
                found.add(rule["alert"])
    assert found == set(waits), f"no such alerts in docker/alerts.yml: {set(waits) - found}"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a Prometheus scraping claimd on the given port; yields its base URL maker.

    ``waits``: alert name -> the `for:` to use instead of the shipped one.
    """
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(claimd_port: int, waits: dict[str, str] | None = None) -> str:
        assert PROMETHEUS is not None
        rules = shipped_rules(tmp_path / "alerts.yml", waits)
        config = prometheus_config(tmp_path / "prometheus.yml", claimd_port, rules)
        port = free_port()
        with (tmp_path / "prometheus.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        PROMETHEUS,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def alerts_named(base: str, name: str) -> list[dict[str, Any]]:
    """The alerts of rule ``name`` Prometheus holds now (pending or firing)."""
    status, body = await http_get(f"{base}/api/v1/alerts")
    alerts: list[dict[str, Any]] = json.loads(body)["data"]["alerts"] if status == 200 else []
    return [a for a in alerts if a["labels"]["alertname"] == name]


async def query(base: str, promql: str) -> list[dict[str, Any]]:
    status, body = await http_get(
        f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    )
    if status != 200:
        return []
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


@pytest.mark.e2e
@pytest.mark.prometheus
async def test_a_real_prometheus_reads_the_run_history_and_fires_the_failure_alert(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
    prometheus: Callable[..., str],
) -> None:
    port = free_port()
    jobs = """
[jobs.beat]
every = "1s"
run = { shell = ["true"] }

[jobs.broken]
every = "1s"
max_attempts = 1
run = { shell = ["sh", "-c", "echo no such table >&2; exit 1"] }
"""
    replica = spawn(
        "run",
        "--config",
        str(
            write_config(
                tmp_path / "claimd.toml",
                jobs=jobs,
                database_url=schema_url,
                nats_url=nats_url,
                deployment=deployment,
                http=f"127.0.0.1:{port}",
                claim_interval="100ms",
                materialize_interval="500ms",
                shutdown_grace="5s",
            )
        ),
        label="replica",
    )
    base = prometheus(port)

    async def scraping() -> bool:
        return [r["value"][1] for r in await query(base, 'up{job="claimd"}')] == ["1"]

    await eventually(scraping, timeout=60, what="Prometheus to scrape claimd (up == 1)")

    # The failure alert, from the shipped rule as it is (no `for`), for the job that fails.
    async def firing() -> list[dict[str, Any]]:
        status, body = await http_get(f"{base}/api/v1/alerts")
        alerts = json.loads(body)["data"]["alerts"] if status == 200 else []
        return [
            a
            for a in alerts
            if a["labels"]["alertname"] == "ClaimdJobFailing" and a["state"] == "firing"
        ]

    async def alert_fired() -> bool:
        return bool(await firing())

    await eventually(alert_fired, timeout=60, what="ClaimdJobFailing to fire")
    (alert,) = await firing()
    assert alert["labels"]["claimd_job"] == "broken"
    assert alert["labels"]["severity"] == "warning"
    assert "failed with no attempt left" in alert["annotations"]["description"]

    # Stop the job's runs (pause), let what was claimed finish, then the counter
    # Prometheus scraped must equal the attempts recorded in SQL.
    paused = await asyncio.to_thread(
        subprocess.run,
        [*claimd_command(), "pause", "beat", "--database-url", schema_url],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert paused.returncode == 0, paused.stderr
    conn = await asyncpg.connect(schema_url)
    try:

        async def quiet() -> bool:
            return (
                await conn.fetchval(
                    "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
                    "WHERE j.name = 'beat' AND r.state IN ('claimed', 'running')"
                )
                == 0
            )

        await eventually(quiet, timeout=30, what="beat's claimed runs to finish")
        recorded = await conn.fetchval(
            "SELECT count(*) FROM job_run_attempts a JOIN job_runs r ON r.id = a.run_id "
            "JOIN jobs j ON j.id = r.job_id WHERE j.name = 'beat' AND a.outcome = 'succeeded'"
        )
    finally:
        await conn.close()
    assert recorded > 0
    promql = 'claimd_runs_completed_total{job="claimd",claimd_job="beat",outcome="succeeded"}'

    async def counter_matches() -> bool:
        result = await query(base, promql)
        return [float(r["value"][1]) for r in result] == [float(recorded)]

    await eventually(
        counter_matches,
        timeout=30,
        what=f"Prometheus to read {recorded} succeeded attempts of beat",
    )
    (series,) = await query(base, promql)
    assert "exported_job" not in series["metric"]
    assert series["metric"]["instance"] == f"127.0.0.1:{port}"
    # The histogram and the cluster gauge that claimd writes as text itself
    # (actors/observability/exposition.py), as this Prometheus reads them.
    durations = 'claimd_run_duration_seconds_count{job="claimd",claimd_job="beat"}'
    median = 'histogram_quantile(0.5, claimd_run_duration_seconds_bucket{claimd_job="beat"})'
    paused_gauge = 'claimd_job_paused{job="claimd",claimd_job="beat"}'

    async def written_text_read() -> bool:
        counts = [float(r["value"][1]) for r in await query(base, durations)]
        quantile = [float(r["value"][1]) for r in await query(base, median)]
        flag = [float(r["value"][1]) for r in await query(base, paused_gauge)]
        return (
            counts == [float(recorded)]
            and len(quantile) == 1
            and 0 <= quantile[0] < 60
            and flag == [1.0]
        )

    await eventually(
        written_text_read,
        timeout=30,
        what="Prometheus to read beat's durations histogram and its paused gauge",
    )
    print(
        f"\n[prometheus] {promql} = {recorded} = succeeded attempts in SQL; "
        f"ClaimdJobFailing firing for claimd_job=broken"
    )
    assert replica.returncode() is None


@pytest.mark.e2e
@pytest.mark.prometheus
async def test_a_real_prometheus_fires_no_replica_reporting_once_the_last_replica_stops(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
    prometheus: Callable[..., str],
) -> None:
    """The outage alert on a real server: quiet while a replica answers, firing once none does.

    The shipped expression, labels and annotations; only its `for:` (a minute) is
    3 s here, with the test's 1 s scrape and evaluation, to keep the run short.
    """
    port = free_port()
    replica = spawn(
        "run",
        "--config",
        str(
            write_config(
                tmp_path / "claimd.toml",
                jobs='[jobs.beat]\nevery = "1s"\nrun = { shell = ["true"] }\n',
                database_url=schema_url,
                nats_url=nats_url,
                deployment=deployment,
                http=f"127.0.0.1:{port}",
                shutdown_grace="5s",
            )
        ),
        label="replica",
    )
    base = prometheus(port, waits={"ClaimdNoReplicaReporting": "3s"})

    async def scraping() -> bool:
        return [r["value"][1] for r in await query(base, 'up{job="claimd"}')] == ["1"]

    await eventually(scraping, timeout=60, what="Prometheus to scrape claimd (up == 1)")

    # Before the first scrape nothing answered, so the alert may have been
    # pending (or firing): with the replica answering it must clear.
    async def quiet() -> bool:
        return await alerts_named(base, "ClaimdNoReplicaReporting") == []

    await eventually(quiet, timeout=30, what="ClaimdNoReplicaReporting to clear while up == 1")

    replica.terminate()
    assert await replica.wait(30) == 0, replica.stderr()[-3000:]

    async def firing() -> bool:
        return any(
            a["state"] == "firing" for a in await alerts_named(base, "ClaimdNoReplicaReporting")
        )

    await eventually(firing, timeout=60, what="ClaimdNoReplicaReporting to fire")
    (alert,) = await alerts_named(base, "ClaimdNoReplicaReporting")
    assert alert["labels"] == {"alertname": "ClaimdNoReplicaReporting", "severity": "critical"}
    assert alert["annotations"]["summary"] == "no claimd replica is reporting"
    print("\n[prometheus] ClaimdNoReplicaReporting firing after the only replica stopped")

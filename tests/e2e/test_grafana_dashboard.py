"""docker/grafana: the dashboard's shape, and every panel query on a real Prometheus.

- The dashboard JSON against a JSON schema written here from the fields of
  Grafana's dashboard model that a provisioned dashboard needs (title, uid,
  schemaVersion, panels with id, type, gridPos and targets, the templating
  list): it proves the shape Grafana reads, not that Grafana renders it (no
  Grafana runs in CI). Beside it: panel ids unique, panels inside the 24-column
  grid and not overlapping, every panel on the provisioned datasource's uid,
  the `job` variable used, every claimd metric named one that claimd defines.
- The provisioning files and the compose service (loopback only, the admin
  password from GRAFANA_ADMIN_PASSWORD).
- A real Prometheus (Debian's `prometheus`) scraping a `claimd run` with a
  succeeding, a failing and a late job: every panel query, with Grafana's
  variables substituted (`job` as All and as one job), is accepted and returns
  data; with another job substituted, none is an error. The failing job shows
  in "Failing now" and the late job in "Overdue".
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from actors.adapters.embedded import free_port
from tests.e2e.helpers import ClaimdProcess, eventually, write_config
from tests.e2e.observe_helpers import http_get, spawn
from tests.e2e.test_prometheus import prometheus

__all__ = ["prometheus", "spawn"]  # fixtures

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "claimd.json"

# The fields of Grafana's dashboard model (schemaVersion 39) a provisioned
# dashboard is read by; additional fields are allowed, as Grafana allows them.
DATASOURCE_REF = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"type": "string"}, "uid": {"type": "string"}},
}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "instant": {"type": "boolean"},
        "range": {"type": "boolean"},
        "format": {"enum": ["time_series", "table", "heatmap"]},
        "datasource": DATASOURCE_REF,
    },
}
GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "stat", "timeseries", "table", "heatmap"]},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "gridPos": GRID_POS,
        "datasource": DATASOURCE_REF,
        "targets": {"type": "array", "items": TARGET},
        "fieldConfig": {
            "type": "object",
            "required": ["defaults", "overrides"],
            "properties": {"defaults": {"type": "object"}, "overrides": {"type": "array"}},
        },
        "options": {"type": "object"},
        "interval": {"type": "string", "pattern": r"^\d+[smh]$"},
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["collapsed", "panels"]},
    "else": {"required": ["datasource", "targets"], "properties": {"targets": {"minItems": 1}}},
}
VARIABLE = {
    "type": "object",
    "required": ["name", "type"],
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "type": {"enum": ["query", "custom", "constant", "datasource", "interval", "textbox"]},
        "query": {"type": ["string", "object"]},
        "datasource": DATASOURCE_REF,
        "includeAll": {"type": "boolean"},
        "allValue": {"type": "string"},
        "multi": {"type": "boolean"},
        "refresh": {"enum": [0, 1, 2]},
    },
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "uid",
        "title",
        "schemaVersion",
        "panels",
        "templating",
        "time",
        "editable",
        "graphTooltip",
    ],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "refresh": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": VARIABLE}},
        },
        "annotations": {
            "type": "object",
            "properties": {"list": {"type": "array"}},
        },
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
    },
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def query_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def defined_metric_names() -> set[str]:
    """Every claimd_* name the metric modules define (a histogram's series add suffixes)."""
    names: set[str] = set()
    for module in (ROOT / "actors" / "observability").glob("*.py"):
        names |= set(re.findall(r'"(claimd_[a-z_]+)"', module.read_text()))
    return names


def test_the_dashboard_matches_grafanas_dashboard_model() -> None:
    board = dashboard()
    jsonschema.Draft202012Validator.check_schema(DASHBOARD_SCHEMA)
    jsonschema.validate(board, DASHBOARD_SCHEMA)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids repeat"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_panel_reads_the_provisioned_datasource_and_claimds_own_metrics() -> None:
    board = dashboard()
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    (variable,) = board["templating"]["list"]
    assert variable["name"] == "job"
    assert variable["datasource"]["uid"] == source["uid"]
    assert "claimd_job" in variable["definition"]
    defined = defined_metric_names()
    used_job = False
    for panel in query_panels(board):
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]
            used_job |= "$job" in target["expr"]
            for name in re.findall(r"\bclaimd_[a-z_]+\b", target["expr"]):
                if name == "claimd_job":
                    continue  # the label
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert base in defined, f"{panel['title']}: {name} is not a claimd metric"
    assert used_job


def test_provisioning_and_the_compose_service() -> None:
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/claimd.yaml").read_text())[
        "providers"
    ]
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"]}
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert all(port.startswith("127.0.0.1:") for port in grafana["ports"])
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?"), "no default password"
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]


# --- every query on a real Prometheus -------------------------------------------------

JOBS = """
[jobs.beat]
every = "1s"
run = { shell = ["true"] }

[jobs.broken]
every = "1s"
max_attempts = 1
run = { shell = ["sh", "-c", "echo no such table >&2; exit 1"] }

[jobs.late]
every = "1s"
overlap = "queue"
timeout = "20s"
run = { shell = ["sleep", "3"] }
"""


def substituted(expr: str, job: str) -> str:
    """The query as Grafana sends it: its variables replaced (1 s scrapes here)."""
    return (
        expr.replace("$__rate_interval", "10s")
        .replace("$__interval", "5s")
        .replace("${job}", job)
        .replace("$job", job)
    )


async def ask(base: str, expr: str, instant: bool) -> tuple[str, list[dict[str, Any]], str]:
    """Prometheus's status, result and error for one query (a range of the last 30 s)."""
    now = time.time()
    if instant:
        url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": now})
    else:
        url = f"{base}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": now - 30, "end": now, "step": 5}
        )
    status, body = await http_get(url)
    if status not in (200, 400, 422):  # 0: nothing answered; 503 while it starts
        return f"HTTP {status}", [], body[:200]
    answer = json.loads(body)
    return answer["status"], answer.get("data", {}).get("result", []), answer.get("error", "")


def targets() -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in query_panels(dashboard()):
        for target in panel["targets"]:
            yield panel["title"], target


@pytest.mark.e2e
@pytest.mark.prometheus
async def test_every_panel_query_returns_data_from_a_real_prometheus(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
    prometheus: Callable[..., str],
) -> None:
    port = free_port()
    replica = spawn(
        "run",
        "--config",
        str(
            write_config(
                tmp_path / "claimd.toml",
                jobs=JOBS,
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
        status, result, _ = await ask(base, 'up{job="claimd"}', instant=True)
        return status == "success" and [r["value"][1] for r in result] == ["1"]

    await eventually(scraping, timeout=60, what="Prometheus to scrape claimd (up == 1)")

    # No query is an error, whatever job is chosen.
    for title, target in targets():
        for job in (".*", "beat", "broken", "late", "no-such-job"):
            expr = substituted(target["expr"], job)
            status, _, error = await ask(base, expr, target.get("instant", False))
            assert status == "success", f"{title}: {expr}: {error}"

    # Each returns data, for All (".*") and for one job that succeeds ("beat").
    empty: list[str] = []

    async def all_have_data() -> bool:
        empty.clear()
        for title, target in targets():
            for job in (".*", "beat"):
                expr = substituted(target["expr"], job)
                _, result, _ = await ask(base, expr, target.get("instant", False))
                if not result:
                    empty.append(f"{title} [job={job}]: {expr}")
        return not empty

    try:
        await eventually(all_have_data, timeout=60, interval=1.0, what="every panel to have data")
    except AssertionError:
        raise AssertionError("panels without data:\n" + "\n".join(empty)) from None

    # What the panels say: the failing job is failing now, the late one overdue.
    panels = {p["title"]: p for p in query_panels(dashboard())}
    failing_now = substituted(panels["Failing now"]["targets"][0]["expr"], ".*")
    overdue_runs = substituted(panels["Overdue"]["targets"][0]["expr"], ".*")

    async def by_job(expr: str) -> dict[str, float]:
        _, result, _ = await ask(base, expr, instant=True)
        return {r["metric"]["claimd_job"]: float(r["value"][1]) for r in result}

    async def shows_failing_and_late() -> bool:
        failing, overdue = await by_job(failing_now), await by_job(overdue_runs)
        return (
            failing.get("broken") == 1.0
            and failing.get("beat") == 0.0
            and overdue.get("late", 0) > 0
        )

    await eventually(
        shows_failing_and_late, timeout=60, interval=1.0, what="broken failing, late overdue"
    )
    count = sum(1 for _ in targets())
    print(f"\n[grafana] {count} panel queries: none an error, each with data (job=All and beat)")
    assert replica.returncode() is None

"""The OpenAPI document and the server agree by construction; these hold the seams.

The routes the app serves are the table's; every $ref resolves; the bounds
are the operator service's; the time pattern names exactly the calendar's
days; and a request the models refuse is a 400 whose one line names the
parameter or field (an aiohttp test server, no database: the service is never
reached).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import TypeAdapter, ValidationError
from structlog.testing import capture_logs

from actors.http.api import OperatorApi
from actors.http.openapi import OPERATIONS, document
from actors.http.openapi import fields as f
from actors.http.server import build_app
from actors.operator import OperatorService, grid, shapes

TOKEN = "a-token-of-twenty-characters"


def test_the_bounds_are_the_operator_services() -> None:
    assert (f.MAX_PAGE, f.MAX_GRID) == (shapes.MAX_PAGE, grid.MAX_GRID)


def test_every_ref_resolves_and_every_schema_is_used() -> None:
    doc = document()
    text = json.dumps(doc)
    refs = set(re.findall(r'"#/components/schemas/([A-Za-z0-9_-]+)"', text))
    assert refs <= set(doc["components"]["schemas"])
    assert set(doc["components"]["schemas"]) <= refs


@pytest.mark.parametrize(
    ("pattern", "first", "last"),
    [(f"^{f._DATE}$", 1900, 2999), (f"^{f._ANY_DATE}$", 1, 9999)],
    ids=["operator's time", "cursor"],
)
def test_a_date_pattern_names_exactly_the_calendars_days(
    pattern: str, first: int, last: int
) -> None:
    regex = re.compile(pattern)
    for year in (0, 1, 4, 100, 400, 1899, 1900, 1904, 2000, 2024, 2100, 2400, 2999, 3000, 9999):
        for month in range(14):
            for day in (0, 1, 28, 29, 30, 31, 32):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    dt.date.fromisoformat(text)
                    real = first <= year <= last
                except ValueError:
                    real = False
                assert bool(regex.match(text)) == real, text


def test_every_time_the_pattern_allows_is_one_the_server_reads() -> None:
    """Read as the server reads it (pydantic's Rust regex: '$' is the end, newline or not)."""
    time = TypeAdapter(f.Time)
    for text in (
        "2024-02-29",
        "2026-12-01 02:00",
        "2026-12-01T01:00:00.5Z",
        "2999-12-31T23:59-23:59",
    ):
        time.validate_python(text)
        dt.datetime.fromisoformat(text)
    for text in ("2026-02-29", "2026-12-01T24:00", "2026-12-01 02:00\n", "20261201", "NOW"):
        with pytest.raises(ValidationError):
            time.validate_python(text)


class _NoDatabase:
    """A service no test here reaches: the models refuse first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the service was called ({name}) for a request the models refuse")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async def ready() -> dict[str, Any]:
        return {"postgres": "ok", "nats": "ok"}

    api = OperatorApi(cast(OperatorService, _NoDatabase()), [("alice", TOKEN)])
    # Reads need a token once one is configured: every request here sends it.
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(build_app(ready, api)), headers=auth) as test_client:
        yield test_client


async def test_the_app_serves_exactly_the_tables_routes(
    client: TestClient[web.Request, web.Application],
) -> None:
    served = {
        (r.method, r.resource.canonical)
        for r in client.app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    declared = {(op.method.upper(), op.path) for op in OPERATIONS}
    assert served - declared == {("GET", "/"), ("GET", "/static/{name}")}
    assert declared <= served


@pytest.mark.parametrize(
    ("method", "target", "body", "words"),
    [
        ("GET", "/api/runs?since=2026-02-30", None, "query parameter 'since': '2026-02-30' is not"),
        ("GET", "/api/runs?limit=0", None, "query parameter 'limit' must be greater than"),
        ("GET", "/api/runs?limit=1.0", None, "query parameter 'limit' must be a whole number"),
        ("GET", "/api/runs?ahead=yes", None, "query parameter 'ahead' must be true or false"),
        ("GET", "/api/runs?state=done", None, "query parameter 'state': 'done' is not a state"),
        ("GET", "/api/runs?cursor=x", None, "is not a cursor this API returned"),
        ("GET", "/api/runs?limit=1&limit=2", None, "'limit' is given 2 times"),
        ("GET", "/api/jobs/-x", None, "path parameter 'name': '-x' is not a job name"),
        ("GET", "/api/runs/12345", None, "path parameter 'run_id': '12345' is not a run id"),
        ("GET", "/api/jobs/x/audit?from=now", None, "query parameter 'to' is required"),
        ("POST", "/api/jobs/x/trigger", {"at": 5}, "field 'at' must be a valid string"),
        ("POST", "/api/jobs/x/trigger", {"when": "now"}, "unknown field 'when'; allowed: at"),
        ("POST", "/api/jobs/x/trigger", [], "the body must be a JSON object"),
        ("POST", "/api/jobs/x/backfill", None, "a JSON object body is required"),
        ("POST", "/api/jobs/x/backfill", {"from": "now"}, "field 'to' is required"),
        (
            "POST",
            "/api/jobs/x/backfill",
            {"from": "now", "to": "now", "max_runs": "5"},
            "field 'max_runs' must be a valid integer",
        ),
    ],
)
async def test_a_refused_request_is_a_400_naming_the_parameter(
    client: TestClient[web.Request, web.Application],
    method: str,
    target: str,
    body: Any,
    words: str,
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with client.request(method, target, json=body, headers=headers) as response:
        answer = await response.json()
        assert response.status == 400, answer
        assert words in answer["error"], answer
        assert "\n" not in answer["error"]


async def test_a_bug_is_a_json_500_logged_once(
    client: TestClient[web.Request, web.Application],
) -> None:
    """A well-formed request that reaches a failing service: JSON, one log event with the
    traceback, and nothing of it in the answer."""
    with capture_logs() as logs:
        async with client.get("/api/jobs") as response:
            answer = await response.json()
    assert (response.status, response.content_type) == (500, "application/json")
    assert answer == {"error": "internal error (the replica's log has it, with its traceback)"}
    events = [e for e in logs if e["log_level"] in ("error", "critical")]
    assert [e["event"] for e in events] == ["http: unexpected error"], logs
    assert events[0]["path"] == "/api/jobs"
    assert events[0].get("exc_info"), events[0]

"""`tracing = "otlp"` through the real `claimd run`: spans exported over OTLP/HTTP.

A collector of the test's own (an HTTP server on loopback decoding OTLP's
protobuf) receives what `claimd run` exports when told by the standard
variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME). One run's
dispatch, run and execute spans share a trace id, carry the service name,
and the shell job saw a TRACEPARENT naming that trace and the execute span.
Skipped without the claimd[otlp] extra.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from actors.adapters.embedded import free_port
from actors.observability.tracing import missing_for
from tests.e2e.helpers import ClaimdProcess, eventually, write_config
from tests.e2e.observe_helpers import spawn

__all__ = ["spawn"]  # fixture

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(missing_for("otlp") is not None, reason="needs the claimd[otlp] extra"),
]


async def test_claimd_run_exports_one_trace_per_run_over_otlp(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans: list[tuple[str, dict[str, Any], Any]] = []  # (service, attributes, span)

    async def collect(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {
                        a.key: a.value.string_value or a.value.int_value for a in span.attributes
                    }
                    spans.append((resource.get("service.name", ""), attributes, span))
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    seen = tmp_path / "seen.txt"
    try:
        spawn(
            "run",
            "--config",
            str(
                write_config(
                    tmp_path / "claimd.toml",
                    jobs=(
                        '[jobs.traced]\nevery = "1s"\n'
                        f'run = {{ shell = "echo $CLAIMD_RUN_ID $TRACEPARENT >> {seen}", '
                        "use_shell = true }\n"
                    ),
                    database_url=schema_url,
                    nats_url=nats_url,
                    deployment=deployment,
                    http="off",
                    tracing="otlp",
                    shutdown_grace="5s",
                )
            ),
            label="replica",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_SERVICE_NAME": "claimd-under-test",
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            },
        )

        def whole_runs() -> dict[str, dict[str, Any]]:
            runs: dict[str, dict[str, Any]] = {}
            for _, attributes, span in spans:
                run_id = attributes.get("claimd.run_id")
                if run_id:
                    runs.setdefault(str(run_id), {})[span.name] = span
            wanted = {"claimd.dispatch", "claimd.run", "claimd.execute"}
            return {r: s for r, s in runs.items() if set(s) == wanted}

        def lines() -> dict[str, str]:
            text = seen.read_text() if seen.exists() else ""
            return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)

        async def a_run_exported_and_executed() -> bool:
            return bool(set(whole_runs()) & set(lines()))

        await eventually(a_run_exported_and_executed, timeout=60, what="a run's spans exported")
    finally:
        await asyncio.wait_for(runner.cleanup(), 10)
    runs = whole_runs()
    run_id = next(r for r in runs if r in lines())
    dispatch, run, execute = (
        runs[run_id][n] for n in ("claimd.dispatch", "claimd.run", "claimd.execute")
    )
    assert dispatch.trace_id == run.trace_id == execute.trace_id
    assert run.parent_span_id == dispatch.span_id
    assert execute.parent_span_id == run.span_id
    assert {service for service, _, _ in spans} == {"claimd-under-test"}
    # The shell job's TRACEPARENT: version-trace id-execute span id-flags.
    _, trace_id, parent_id, _ = lines()[run_id].strip().split("-")
    assert trace_id == execute.trace_id.hex()
    assert parent_id == execute.span_id.hex()
    print(f"\n[otlp] {len(spans)} spans received; run {run_id}: one trace {trace_id}")

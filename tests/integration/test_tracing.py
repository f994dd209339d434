"""OpenTelemetry traces across two replicas on the real servers (the claimd[otel] extra).

A scheduler replica claims and dispatches, a worker replica executes, both in
this process on the real PostgreSQL and NATS JetStream, spans going to the
SDK's in-memory exporter. One run's spans share one trace id: the scheduler's
``claimd.dispatch`` is the root, the worker's ``claimd.run`` its child (the
context crossed in the NATS message's headers), ``claimd.execute`` the run's
child, and the python job's own span (opened under ``ctx.trace_headers()``) the
execution's child. Every claimd span carries the run id, the job and the instant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.observability import tracing as tracing_module
from actors.replica import Replica
from actors.replica.wiring import Role
from tests.integration import traced_jobs
from tests.integration.helpers import eventually, running

pytestmark = pytest.mark.integration


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = tracing_module.install(tracing_module.OtelTracing(provider))
    traced_jobs.PROVIDER = provider
    try:
        yield exporter
    finally:
        tracing_module.install(previous)
        traced_jobs.PROVIDER = None
        provider.shutdown()


def by_run(spans: tuple[ReadableSpan, ...]) -> dict[str, dict[str, ReadableSpan]]:
    runs: dict[str, dict[str, ReadableSpan]] = {}
    for span in spans:
        run_id = (span.attributes or {}).get("claimd.run_id")
        if isinstance(run_id, str):
            runs.setdefault(run_id, {})[span.name] = span
    return runs


async def test_one_runs_spans_across_two_replicas_share_one_trace(
    make_config: Callable[..., LoadedConfig],
    store: PostgresRunStore,
    tmp_path: Path,
    exported: InMemorySpanExporter,
) -> None:
    loaded = make_config(
        """
        [jobs.traced]
        every = "1s"
        run = { python = "tests.integration.traced_jobs:traced" }
    """,
        claim_interval="50ms",
        materialize_interval="200ms",
    )
    scheduler = Replica(tmp_path / "claimd.toml", loaded, Role.SCHEDULER, replica_id="sched")
    worker = Replica(tmp_path / "claimd.toml", loaded, Role.WORKER, replica_id="work")
    whole = {"claimd.dispatch", "claimd.run", "claimd.execute", "job.work"}
    async with running(scheduler, worker):

        async def a_whole_run_traced() -> bool:
            return any(
                set(spans) == whole for spans in by_run(exported.get_finished_spans()).values()
            )

        await eventually(a_whole_run_traced, timeout=60, what="one run traced end to end")
    run_id, spans = next(
        (r, s) for r, s in by_run(exported.get_finished_spans()).items() if set(s) == whole
    )
    dispatch, run, execute, job = (
        spans[n] for n in ("claimd.dispatch", "claimd.run", "claimd.execute", "job.work")
    )

    def ids(span: ReadableSpan) -> tuple[int, int]:
        assert span.context is not None
        return span.context.trace_id, span.context.span_id

    def parent(span: ReadableSpan) -> int | None:
        return span.parent.span_id if span.parent is not None else None

    trace_ids = {ids(s)[0] for s in (dispatch, run, execute, job)}
    assert len(trace_ids) == 1, "one run's spans in one trace"
    assert dispatch.parent is None
    assert parent(run) == ids(dispatch)[1]
    assert run.parent is not None
    assert run.parent.is_remote
    assert parent(execute) == ids(run)[1]
    assert parent(job) == ids(execute)[1]
    row: Any = await store.pool.fetchrow(
        "SELECT j.name, r.scheduled_at, r.state FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE r.id = $1",
        run_id,
    )
    assert row["state"] == "succeeded"
    for span in (dispatch, run, execute):
        attributes = span.attributes or {}
        assert attributes["claimd.job"] == "traced" == row["name"]
        assert attributes["claimd.scheduled_at"] == row["scheduled_at"].isoformat()
        assert isinstance(attributes["claimd.epoch"], int)
        assert attributes["claimd.epoch"] >= 1
    assert (run.attributes or {})["claimd.recorded"] is True
    assert (execute.attributes or {})["claimd.outcome"] == "succeeded"
    print(
        f"\n[tracing] run {run_id}: dispatch (scheduler) -> run -> execute (worker) -> "
        f"job.work, one trace {next(iter(trace_ids)):032x}"
    )

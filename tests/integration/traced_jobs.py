"""A python job that opens its own span under the context claimd hands it (ctx.trace_headers())."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from actors.domain import RunContext

# Set by the test: the TracerProvider the job's own spans go to.
PROVIDER: Any = None


async def traced(ctx: RunContext) -> None:
    """The job's own work, a span whose parent is claimd's execution span.

    Async: it runs in the replica's process, where the test's provider is (a sync
    job runs in a child process of its own, docs/python-execution.md)."""
    parent = TraceContextTextMapPropagator().extract(ctx.trace_headers())
    tracer = PROVIDER.get_tracer("tests.traced_jobs")
    with tracer.start_as_current_span("job.work", context=parent) as span:
        span.set_attribute("claimd.run_id", ctx.run_id)

"""OpenTelemetry traces of runs: optional (the ``claimd[otel]`` extra), off by default.

One trace per dispatch of a run:

- ``claimd.dispatch`` (the claiming replica): from the claimed run handed to the
  dispatcher to its publish acknowledged by JetStream; the root. Its W3C trace
  context (``traceparent``, ``tracestate``) travels in the dispatch message's
  NATS headers, beside ``Nats-Msg-Id``.
- ``claimd.run`` (the worker): its child, from the run started to its verdict
  recorded (or fenced: the run moved on).
- ``claimd.execute``: the run's child, the execution itself. The job is handed
  this span's context: ``TRACEPARENT`` (and ``TRACESTATE``) in a shell job's
  environment, ``traceparent`` headers on an HTTP job's request,
  ``ctx.trace_headers()`` in a python job's context, so a job's own spans are
  children of its execution.

Every span carries ``claimd.run_id``, ``claimd.job``, ``claimd.scheduled_at``
(the instant), ``claimd.epoch`` and ``claimd.attempt``.

Off (``tracing = "none"``), :func:`tracing` returns :class:`Tracing`, whose
``enabled`` is False: callers test it once per batch or run and do nothing else;
opentelemetry is never imported. On (``tracing = "otlp"``), spans go to an OTLP
exporter configured by the standard ``OTEL_*`` variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``...).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from datetime import datetime
from typing import Any

# An opentelemetry span, or None while tracing is off.
Span = Any

# What "otlp" needs installed: the SDK (claimd[otel]) and an OTLP exporter.
NEEDED = {
    "otlp": (
        ("opentelemetry.sdk", "claimd[otel]"),
        ("opentelemetry.exporter.otlp.proto.http", "claimd[otlp]"),
    )
}


def missing_for(mode: str) -> str | None:
    """The extra to install for ``mode``, or None when everything it needs is there."""
    for module, extra in NEEDED.get(mode, ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return extra
    return None


def run_attributes(
    run_id: str, job: str, scheduled_at: datetime, epoch: int, attempt: int
) -> dict[str, Any]:
    return {
        "claimd.run_id": run_id,
        "claimd.job": job,
        "claimd.scheduled_at": scheduled_at.isoformat(),
        "claimd.epoch": epoch,
        "claimd.attempt": attempt,
    }


class Tracing:
    """Tracing off: nothing is recorded; callers check ``enabled`` first."""

    enabled = False

    def start(
        self,
        name: str,
        attributes: Mapping[str, Any],
        *,
        parent: Mapping[str, str] | None = None,
        parent_span: Span = None,
    ) -> Span:
        """A started span: child of ``parent_span``, else of the W3C context ``parent``."""
        return None

    def context_of(self, span: Span) -> dict[str, str]:
        """The W3C trace context headers naming ``span`` as the parent."""
        return {}

    def end(self, span: Span, error: str | None = None, **attributes: Any) -> None:
        """End ``span``, its status an error when ``error`` is given."""

    def shutdown(self) -> None:
        """Export what is buffered (at the replica's stop)."""


class OtelTracing(Tracing):
    """Spans through an opentelemetry TracerProvider (the SDK's, or a test's)."""

    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace import Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("claimd")
        self._trace = trace
        self._root = Context()
        self._propagator = TraceContextTextMapPropagator()
        self._status = Status
        self._error = StatusCode.ERROR

    def start(
        self,
        name: str,
        attributes: Mapping[str, Any],
        *,
        parent: Mapping[str, str] | None = None,
        parent_span: Span = None,
    ) -> Span:
        if parent_span is not None:
            context = self._trace.set_span_in_context(parent_span)
        elif parent:
            context = self._propagator.extract(parent)
        else:
            context = self._root
        return self._tracer.start_span(name, context=context, attributes=attributes)

    def context_of(self, span: Span) -> dict[str, str]:
        carrier: dict[str, str] = {}
        if span is not None:
            self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def end(self, span: Span, error: str | None = None, **attributes: Any) -> None:
        if span is None:
            return
        if attributes:
            span.set_attributes(attributes)
        if error is not None:
            span.set_status(self._status(self._error, error[:500]))
        span.end()

    def shutdown(self) -> None:
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


_OFF = Tracing()
_current: Tracing = _OFF


def tracing() -> Tracing:
    """The tracing in force (off unless :func:`configure` or :func:`install` said otherwise)."""
    return _current


def install(chosen: Tracing) -> Tracing:
    """Put ``chosen`` in force; returns what was (a test restores it)."""
    global _current
    previous, _current = _current, chosen
    return previous


def configure(mode: str) -> Tracing:
    """Tracing as the ``tracing`` setting says: "none", or "otlp" (the OTEL_* variables)."""
    if mode == "none":
        install(_OFF)
        return _OFF
    if _current.enabled:
        return _current  # one provider a process (a reload or a second replica keeps it)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as given (Resource.create reads
    # them); the service is "claimd" where neither names one.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "claimd"}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    chosen = OtelTracing(provider)
    install(chosen)
    return chosen

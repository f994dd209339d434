"""Tracing (actors/observability/tracing.py): off costs nothing, on hands the context to jobs.

The spans across two replicas are in tests/integration/test_tracing.py; here:
the trace context read from a message's headers (malformed ones dropped), a
shell job's TRACEPARENT, the setting's errors, and that with tracing off no
opentelemetry module is imported at all.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest

from actors.adapters.executors import run_shell
from actors.adapters.nats.codec import trace_context_of
from actors.config import ConfigError, parse_config
from actors.domain import Outcome, ShellSpec
from actors.observability.tracing import Tracing, missing_for, tracing
from tests.unit.test_executors import CTX

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (None, ()),
        ({"Nats-Msg-Id": "r:1"}, ()),
        ({"traceparent": PARENT}, (("traceparent", PARENT),)),
        (
            {"traceparent": PARENT, "tracestate": "vendor=1"},
            (("traceparent", PARENT), ("tracestate", "vendor=1")),
        ),
        ({"traceparent": "00-nothex-b7ad6b7169203331-01"}, ()),
        ({"traceparent": PARENT + "\n"}, ()),
        ({"traceparent": PARENT, "tracestate": "x" * 600}, (("traceparent", PARENT),)),
    ],
)
def test_the_trace_context_is_read_from_the_message_headers(
    headers: dict[str, str] | None, expected: tuple[tuple[str, str], ...]
) -> None:
    assert trace_context_of(SimpleNamespace(headers=headers)) == expected  # type: ignore[arg-type]


def test_a_job_is_handed_the_trace_context_only_when_there_is_one() -> None:
    assert "TRACEPARENT" not in CTX.env()
    assert "traceparent" not in CTX.headers()
    assert CTX.trace_headers() == {}
    traced = replace(CTX, trace_context=(("traceparent", PARENT), ("tracestate", "v=1")))
    assert traced.env()["TRACEPARENT"] == PARENT
    assert traced.env()["TRACESTATE"] == "v=1"
    assert traced.headers()["traceparent"] == PARENT
    assert traced.trace_headers() == {"traceparent": PARENT, "tracestate": "v=1"}


async def test_a_shell_job_sees_traceparent_in_its_environment() -> None:
    traced = replace(CTX, trace_context=(("traceparent", PARENT),))
    spec = ShellSpec(argv=("/bin/sh", "-c", 'echo "tp=$TRACEPARENT"'))
    result = await run_shell(spec, traced, timedelta(seconds=30))
    assert result.outcome is Outcome.SUCCEEDED
    assert f"tp={PARENT}" in (result.output_tail or "")


def test_the_tracing_setting() -> None:
    assert parse_config("[claimd]\n", "c.toml", env={}).settings.tracing == "none"
    with pytest.raises(ConfigError, match=r"claimd\.tracing"):
        parse_config('[claimd]\ntracing = "jaeger"\n', "c.toml", env={})
    env = {"CLAIMD_TRACING": "otlp"}
    if missing_for("otlp") is None:
        assert parse_config("[claimd]\n", "c.toml", env=env).settings.tracing == "otlp"
    else:
        # Without the exporter: one line naming the file, the field and the extra.
        with pytest.raises(ConfigError) as refused:
            parse_config("[claimd]\n", "c.toml", env=env)
        message = str(refused.value)
        assert "c.toml" in message
        assert "claimd.tracing" in message
        assert "from CLAIMD_TRACING" in message
        assert "claimd[otlp]" in message


def test_off_by_default_and_no_opentelemetry_import() -> None:
    """With tracing off a replica's whole code imports no opentelemetry module."""
    assert type(tracing()) is Tracing
    assert tracing().enabled is False
    code = (
        "import sys\n"
        "import actors.cli.main, actors.replica.replica, actors.replica.production\n"
        "import actors.worker.actor, actors.scheduling.dispatcher, actors.adapters.nats_inbox\n"
        "from actors.observability.tracing import configure\n"
        "configure('none')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"

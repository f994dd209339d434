"""Library logs (nats-py, asyncpg: the standard library's logging) come out as our JSON lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from actors.observability import configure_logging, get_logger


@pytest.fixture
def json_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers, root.level = handlers, level
    structlog.reset_defaults()


def test_a_library_error_with_a_traceback_is_one_json_line(
    json_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO")
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError as exc:
        # What nats-py's default error callback does on a lost connection.
        logging.getLogger("nats.aio.client").error("nats: encountered error", exc_info=exc)
    logging.getLogger("asyncpg.pool").warning("reconnecting to postgresql://u:secret@db/x")
    get_logger("replica").warning("ours", run_id="r1")
    lines = capsys.readouterr().err.splitlines()
    events = [json.loads(line) for line in lines]  # every line is JSON: no raw traceback
    assert [e["event"] for e in events] == [
        "nats: encountered error",
        "reconnecting to postgresql://u:***@db/x",
        "ours",
    ]
    nats_event = events[0]
    assert (nats_event["logger"], nats_event["level"]) == ("nats.aio.client", "error")
    assert "ConnectionResetError" in nats_event["exception"]
    assert "Traceback" in nats_event["exception"]
    assert events[2]["run_id"] == "r1"

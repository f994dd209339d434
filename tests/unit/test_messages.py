"""Dispatch messages: a valid one round-trips; anything else is a PoisonMessage with a reason."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from actors.adapters.nats import MAX_MESSAGE_BYTES, PoisonMessage, decode, encode
from actors.ports import DispatchMessage

DEPLOYMENT = "prod"
RUN_ID = "0b5c7a52-3f3e-4e0e-9d51-6a1d2c3b4a59"
MESSAGE = DispatchMessage(
    run_id=RUN_ID,
    epoch=3,
    job="nightly-export",
    scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    attempt=2,
    deployment=DEPLOYMENT,
)


def body(**changes: Any) -> dict[str, Any]:
    """The JSON object of a valid message, with some fields changed (or removed with ...)."""
    data: dict[str, Any] = json.loads(encode(MESSAGE))
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return data


def raw(**changes: Any) -> bytes:
    return json.dumps(body(**changes)).encode()


def test_valid_message_round_trips() -> None:
    data = encode(MESSAGE)
    assert len(data) < MAX_MESSAGE_BYTES
    assert decode(data, DEPLOYMENT) == MESSAGE
    assert json.loads(data)["v"] == 1


def test_round_trip_keeps_the_instant() -> None:
    decoded = decode(encode(MESSAGE), DEPLOYMENT)
    assert decoded.scheduled_at == MESSAGE.scheduled_at
    assert decoded.scheduled_at.utcoffset() is not None
    assert decoded.msg_id == f"{RUN_ID}:3"


def test_uuid_is_normalised() -> None:
    assert decode(raw(run_id=RUN_ID.upper()), DEPLOYMENT).run_id == RUN_ID


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json at all", "not_json"),
        (b"", "not_json"),
        (b'{"v": 1,', "not_json"),
        (b"\xff\xfe\x00garbage", "not_json"),
        (b"[1, 2, 3]", "wrong_schema"),
        (b'"a string"', "wrong_schema"),
        (b"null", "wrong_schema"),
        (b"{}", "wrong_schema"),
        (raw(v=2), "wrong_schema"),
        (raw(v="1"), "wrong_schema"),
        (raw(v=...), "wrong_schema"),
        (raw(run_id=...), "wrong_schema"),
        (raw(epoch=...), "wrong_schema"),
        (raw(job=...), "wrong_schema"),
        (raw(scheduled_at=...), "wrong_schema"),
        (raw(attempt=...), "wrong_schema"),
        (raw(deployment=...), "wrong_schema"),
        (raw(run_id="not-a-uuid"), "wrong_schema"),
        (raw(run_id=12345), "wrong_schema"),
        (raw(run_id=None), "wrong_schema"),
        (raw(epoch=0), "wrong_schema"),
        (raw(epoch=-1), "wrong_schema"),
        (raw(epoch="3"), "wrong_schema"),
        (raw(epoch=3.0), "wrong_schema"),
        (raw(epoch=True), "wrong_schema"),  # a bool is an int to Python, not to us
        (raw(epoch=2**63), "wrong_schema"),  # beyond the bigint the store compares with
        (raw(attempt=0), "wrong_schema"),
        (raw(attempt="2"), "wrong_schema"),
        (raw(attempt=None), "wrong_schema"),
        (raw(job=42), "wrong_schema"),
        (raw(job=["a"]), "wrong_schema"),
        (raw(deployment=7), "wrong_schema"),
        (raw(scheduled_at="yesterday"), "wrong_schema"),
        (raw(scheduled_at=1774746000), "wrong_schema"),
        (raw(scheduled_at="2026-03-29T01:00:00"), "wrong_schema"),  # no offset: which instant?
        (raw(deployment="staging"), "other_deployment"),
        (raw(deployment=""), "other_deployment"),
        (b" " * (MAX_MESSAGE_BYTES + 1), "oversized"),
        (raw(job="x" * MAX_MESSAGE_BYTES), "oversized"),
    ],
)
def test_poison_messages(data: bytes, reason: str) -> None:
    with pytest.raises(PoisonMessage) as info:
        decode(data, DEPLOYMENT)
    assert info.value.reason == reason
    assert str(info.value).startswith(f"{reason}: ")
    # The worker catches ValueError: a poison message must be one.
    assert isinstance(info.value, ValueError)


def test_other_deployment_says_which() -> None:
    with pytest.raises(PoisonMessage, match="other_deployment: staging"):
        decode(raw(deployment="staging"), DEPLOYMENT)


def test_oversized_is_judged_before_parsing() -> None:
    # Valid JSON of a right message, padded past the limit: still refused by size.
    data = encode(MESSAGE)[:-1] + b"," + b" " * MAX_MESSAGE_BYTES + b"}"
    with pytest.raises(PoisonMessage) as info:
        decode(data, DEPLOYMENT)
    assert info.value.reason == "oversized"
    assert str(len(data)) in str(info.value)


def test_extra_fields_are_tolerated_for_forward_compatibility() -> None:
    assert decode(raw(trace_id="abc"), DEPLOYMENT) == MESSAGE


def test_due_at_round_trips_and_a_message_without_it_starts_at_once() -> None:
    # A retry is due later than its instant: the worker holds until due_at.
    retry = dataclasses.replace(MESSAGE, due_at=datetime(2026, 3, 29, 1, 5, tzinfo=UTC))
    assert decode(encode(retry), DEPLOYMENT) == retry
    assert "due_at" not in json.loads(encode(MESSAGE))  # None is left out: older workers
    assert decode(raw(), DEPLOYMENT).due_at is None  # a message of an older claimer


@pytest.mark.parametrize("due_at", [5, "2026-03-29T01:00:00", "soon"])
def test_a_bad_due_at_is_poison(due_at: object) -> None:
    with pytest.raises(PoisonMessage) as info:
        decode(raw(due_at=due_at), DEPLOYMENT)
    assert info.value.reason == "wrong_schema"

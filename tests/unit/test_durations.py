"""Durations as the config file writes them: parse, format, and the refusals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.domain import InvalidDuration, format_duration, parse_duration
from actors.domain.durations import MAX_DURATION


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("30d", timedelta(days=30)),
        ("1.5h", timedelta(minutes=90)),
        ("0.25s", timedelta(milliseconds=250)),
        (" 30s ", timedelta(seconds=30)),
        ("30 s", timedelta(seconds=30)),
        ("3650d", timedelta(days=3650)),
    ],
)
def test_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0s", "'0s' must be greater than zero"),
        ("0ms", "must be greater than zero"),
        ("0.0000001ms", "must be greater than zero"),  # rounds to zero
        ("-5s", "'-5s' must be greater than zero"),
        ("-1.5h", "must be greater than zero"),
        ("30", "'30' is not a duration; write a number and a unit"),
        ("", "is not a duration"),
        ("s", "is not a duration"),
        ("thirty seconds", "is not a duration"),
        ("30S", "is not a duration"),
        ("30sec", "is not a duration"),
        ("1e3s", "is not a duration"),
        ("1h30m", "is not a duration"),
        ("inf s", "is not a duration"),
        ("3651d", "'3651d' is longer than the maximum of 3650d"),
        ("99999d", "longer than the maximum of 3650d"),
        ("87600h1", "is not a duration"),
        ("87601h", "longer than the maximum"),
        # Past what timedelta itself can hold: still a clear refusal, not OverflowError.
        ("99999999999999999999999d", "longer than the maximum of 3650d"),
        ("1" + "0" * 400 + "s", "longer than the maximum of 3650d"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(InvalidDuration, match=message):
        parse_duration(text)


@pytest.mark.parametrize("value", [30, 1.5, None, b"30s", ["30s"]])
def test_parse_refuses_non_strings(value: object) -> None:
    with pytest.raises(InvalidDuration, match="expected a duration string with a unit"):
        parse_duration(value)  # type: ignore[arg-type]


def test_zero_only_where_allowed() -> None:
    assert parse_duration("0s", allow_zero=True) == timedelta(0)
    with pytest.raises(InvalidDuration, match="greater than zero"):
        parse_duration("-1s", allow_zero=True)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(seconds=30), "30s"),
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=15), "15m"),
        (timedelta(hours=2), "2h"),
        (timedelta(days=1), "1d"),
        (timedelta(hours=36), "36h"),
        (timedelta(milliseconds=1500), "1500ms"),
        (timedelta(0), "0ms"),
    ],
)
def test_format(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_DURATION // timedelta(milliseconds=1)))
def test_format_then_parse_round_trips(ms: int) -> None:
    value = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(value)) == value

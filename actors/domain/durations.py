"""Durations as the config file writes them: ``"500ms"``, ``"30s"``, ``"15m"``, ``"2h"``."""

from __future__ import annotations

import re
from datetime import timedelta
from functools import lru_cache

from actors.domain.errors import InvalidDuration

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
# The sign is matched so that "-5s" is reported as "must be greater than zero".
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
# Anything above this is a typo, not a schedule: it would overflow datetime math.
MAX_DURATION = timedelta(days=3650)


def parse_duration(text: str, *, allow_zero: bool = False) -> timedelta:
    """Parse a duration string with a unit; zero only where ``allow_zero`` says so."""
    if not isinstance(text, str):
        raise InvalidDuration(f"expected a duration string with a unit such as '30s', got {text!r}")
    return _parse(text, allow_zero)


# A config of 100,000 jobs writes a handful of distinct durations: each is
# parsed once and its (immutable) timedelta shared. An error is not cached.
@lru_cache(maxsize=1024)
def _parse(text: str, allow_zero: bool) -> timedelta:
    if not isinstance(text, str):  # pragma: no cover - checked by parse_duration
        raise InvalidDuration(f"expected a duration string with a unit such as '30s', got {text!r}")
    match = _PATTERN.match(text)
    if match is None:
        raise InvalidDuration(
            f"{text!r} is not a duration; write a number and a unit "
            "(ms, s, m, h, d), e.g. '500ms', '30s', '15m', '2h'"
        )
    try:
        value = float(match.group(1)) * _UNITS[match.group(2)]
    except OverflowError:  # "99999999999999999999d" is beyond timedelta itself
        raise InvalidDuration(f"{text!r} is longer than the maximum of 3650d") from None
    if value <= timedelta(0) and not (allow_zero and value == timedelta(0)):
        raise InvalidDuration(f"{text!r} must be greater than zero")
    if value > MAX_DURATION:
        raise InvalidDuration(f"{text!r} is longer than the maximum of 3650d")
    return value


def format_duration(value: timedelta) -> str:
    """The shortest exact string for a duration, for messages and round trips."""
    ms = round(value.total_seconds() * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0 and ms >= size:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def human_duration(value: timedelta) -> str:
    """An elapsed time as an operator reads it: ``250ms``, ``5s``, ``2m 5s``, ``1h 2m``, ``3d 4h``.

    The two largest units (rounded down below the second: a tenth of a second is
    noise in a run's duration once it runs for minutes).
    """
    ms = round(value.total_seconds() * 1000)
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    seconds = ms // 1000
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
        elif parts:
            parts.append("")  # a zero unit still counts as one of the two shown
        if len(parts) == 2:
            break
    return sign + " ".join(p for p in parts if p)

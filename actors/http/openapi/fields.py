"""The API's values as pydantic types: each pattern is both the server's check and the document's.

A pattern here is anchored and written with explicit ASCII classes (no ``\\d``,
no look-around), so the three engines that read it agree: pydantic's Rust
regex on the server, ECMA-262 in a client, and schemathesis' generator.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from actors.config import JOB_NAME_PATTERN
from actors.domain import RunState


def _date(year: str, leap: str) -> str:
    """The days each month has, 29 February in the leap years ``leap`` names."""
    return (
        f"(?:{year}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
        "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
        "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
        f"|{leap}-02-29)"
    )


# An operator's time: years 1900-2999, where a day's worth of offset or zone, and the
# audit's look-around of a few years, stay far from the calendar's ends.
_DATE = _date(
    "(?:19[0-9]{2}|2[0-9]{3})", "(?:(?:19|2[0-9])(?:0[48]|[2468][048]|[13579][26])|2[048]00)"
)
# A cursor names a run that exists, which may be any year datetime holds (0001-9999).
_ANY_DATE = _date(
    "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)",
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)",
)
_CLOCK = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_OFFSET = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

TIME_PATTERN = f"^(?:now|{_DATE}(?:[T ]{_CLOCK}(?::[0-5][0-9](?:[.][0-9]{{1,6}})?)?{_OFFSET}?)?)$"
# What encode_cursor writes: the last run's scheduled_at in UTC (as isoformat() spells
# it) and its id.
CURSOR_PATTERN = f"^{_ANY_DATE}T{_CLOCK}:[0-5][0-9](?:[.][0-9]{{6}})?[+]00:00~{_UUID}$"
RUN_ID_PATTERN = f"^{_UUID.replace('a-f', 'a-fA-F')}$"
_STATE = "(?:" + "|".join(s.value for s in RunState) + ")"
STATES_PATTERN = f"^{_STATE}(?:,{_STATE})*$"

TIME_HELP = (
    "ISO 8601, a year from 1900 to 2999: a date, or a date and a time to the minute, "
    "second or microsecond, "
    "e.g. '2026-12-01', '2026-12-01 02:00' or '2026-12-01T01:00:00Z', optionally with "
    "an offset (Z or +HH:MM); or 'now'. A time without an offset is read in the job's "
    "time zone (UTC where no job is named)."
)
STATES = [s.value for s in RunState]

# What a value that misses its pattern is not, for the error's one line.
PATTERN_HELP = {
    TIME_PATTERN: "an ISO 8601 time of the years 1900-2999 (e.g. '2026-12-01', "
    "'2026-12-01 02:00' or '2026-12-01T01:00Z') or 'now'",
    CURSOR_PATTERN: "a cursor this API returned (a page's next_cursor)",
    RUN_ID_PATTERN: "a run id (a UUID such as '0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b')",
    JOB_NAME_PATTERN: "a job name (a letter or digit, then up to 99 letters, digits, '_', "
    "'.' or '-')",
    STATES_PATTERN: f"a state ({', '.join(STATES)}) or several, comma-separated",
}

# The same bounds the operator service checks (tests/unit/test_openapi.py holds them equal).
MAX_PAGE = 1000
MAX_GRID = 200
MAX_BIGINT = 2**63 - 1

_DECIMAL = re.compile(r"-?[0-9]{1,20}")


def _query_integer(value: Any) -> Any:
    """A query integer is decimal digits only: no spaces, underscores, signs or fractions."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError("must be a whole number")
        return int(value)
    return value


def _whole_number(value: Any) -> Any:
    """JSON Schema's integer is a number with no fraction: ``5.0`` is the integer 5."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _query_boolean(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("true", "false"):
            raise ValueError("must be true or false")
        return value == "true"
    return value


def _pattern(pattern: str, description: str, **extra: Any) -> Any:
    """A string matching ``pattern``; ``description`` is also what a mismatch's error says."""
    return Field(pattern=pattern, description=description, **extra)


JobName = Annotated[
    str,
    _pattern(
        JOB_NAME_PATTERN,
        "a job's name: a letter or digit, then up to 99 letters, digits, '_', '.' or '-'",
    ),
]
RunId = Annotated[
    str,
    _pattern(
        RUN_ID_PATTERN, "a run's id, a UUID", examples=["0b7c3a9e-5d8f-4f3e-9a51-1c2d3e4f5a6b"]
    ),
]
Time = Annotated[str, _pattern(TIME_PATTERN, TIME_HELP, examples=["2026-12-01 02:00"])]
Cursor = Annotated[
    str,
    _pattern(CURSOR_PATTERN, "the next_cursor of the previous page, as it was returned"),
]
States = Annotated[
    str,
    _pattern(STATES_PATTERN, f"one state or several, comma-separated: {', '.join(STATES)}"),
]


# After a query integer's bounds, so that pydantic checks them on the converted value and
# writes them into the schema: Annotated[int, Field(ge=..., le=...), FROM_QUERY_TEXT].
FROM_QUERY_TEXT = BeforeValidator(_query_integer)
# The same for a JSON body's integer, which may be spelled 5.0.
WHOLE_NUMBER = BeforeValidator(_whole_number)


QueryBool = Annotated[bool, BeforeValidator(_query_boolean)]

# Response values: what the server writes, described for a client.
UtcTime = Annotated[str, Field(json_schema_extra={"format": "date-time"}, description="UTC")]
LocalTime = Annotated[str, Field(description="the same instant in the job's time zone")]
Uuid = Annotated[str, Field(json_schema_extra={"format": "uuid"})]

"""What every executor shares: the output tail, templates, secrets and their scrubbing."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import timedelta

from actors.domain import (
    ExecutionResult,
)

OUTPUT_TAIL_BYTES = 4096
KILL_GRACE = 5.0


def fill(template: str, values: dict[str, str]) -> str:
    # Only the names claimd defines are replaced; other braces stay as written.
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def elapsed(start: float) -> timedelta:
    return timedelta(seconds=time.monotonic() - start)


class Tail:
    """The last bytes of a stream, bounded whatever the job prints."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= self._limit and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-self._limit :].decode("utf-8", "replace")


class MissingSecret(LookupError):
    """A secret the job names is not in claimd's environment."""


def resolve_secrets(mapping: Mapping[str, str]) -> dict[str, str]:
    """Target name -> value, read from this process's environment at run time."""
    missing = [source for source in mapping.values() if source not in os.environ]
    if missing:
        raise MissingSecret(
            f"secret variable(s) not set in claimd's environment: {', '.join(sorted(missing))}"
        )
    return {target: os.environ[source] for target, source in mapping.items()}


def scrub(result: ExecutionResult, secrets: Iterable[str]) -> ExecutionResult:
    """The result with every secret value replaced by *** in what is recorded."""
    values = sorted((v for v in secrets if len(v) >= 4), key=len, reverse=True)
    if not values:
        return result

    def clean(text: str | None) -> str | None:
        if text is None:
            return None
        for value in values:
            text = text.replace(value, "***")
        return text

    return dataclasses.replace(
        result, error=clean(result.error), output_tail=clean(result.output_tail)
    )


# claimd's own settings travel in CLAIMD_* variables (the database URL among
# them); a job is told its run in CLAIMD_* variables too, set afresh per run.
CLAIMD_PREFIX = "CLAIMD_"


def withheld(name: str, also: Iterable[str] = ()) -> bool:
    """Whether a variable of claimd's environment is kept from a job's."""
    return name.startswith(CLAIMD_PREFIX) or name in also


def job_environment(also_withheld: Iterable[str] = ()) -> dict[str, str]:
    """claimd's environment without its own settings and secrets: what a job starts from.

    ``also_withheld`` names more variables to keep out (the API token's, which
    the settings name).
    """
    extra = frozenset(also_withheld)
    return {k: v for k, v in os.environ.items() if not withheld(k, extra)}


def withheld_values(also_withheld: Iterable[str] = ()) -> list[str]:
    """The values of the variables kept from jobs: scrubbed from any output kept."""
    extra = frozenset(also_withheld)
    return [v for k, v in os.environ.items() if withheld(k, extra) and len(v) >= 8]

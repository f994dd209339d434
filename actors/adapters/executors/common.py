"""What every executor shares: the output tail, templates, secrets and their scrubbing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from datetime import timedelta

from actors.domain import (
    ExecutionResult,
    RunContext,
    ShellSpec,
)
from actors.observability.logs import get_logger
from actors.observability.secrets import MASKER, looks_like_secret

OUTPUT_TAIL_BYTES = 4096
KILL_GRACE = 5.0
# What a job gets of claimd's environment without asking (inherit_env asks for more).
BASE_ENV = ("PATH", "HOME", "LANG", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def fill(template: str, values: dict[str, str]) -> str:
    # Only the names claimd defines are replaced; other braces stay as written.
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def elapsed(start: float) -> timedelta:
    return timedelta(seconds=time.monotonic() - start)


# Where an attempt's output also goes as it is read (live output,
# actors/adapters/live_output.py): set around one execution, taken by the Tails
# made during it. Called from any thread (an async job's loop), so cheap and safe.
OUTPUT_SINK: ContextVar[Callable[[bytes], None] | None] = ContextVar(
    "claimd_output_sink", default=None
)


class Tail:
    """The last bytes of a stream, bounded whatever the job prints."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._limit = limit
        self._sink = OUTPUT_SINK.get()

    def add(self, chunk: bytes) -> None:
        if self._sink is not None:
            self._sink(chunk)
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
    missing = [
        # A source that looks like a value pasted in place of its name (the
        # config refuses them; a stored definition may predate that) is not quoted.
        f"the variable behind {target}" if looks_like_secret(source) else source
        for target, source in mapping.items()
        if source not in os.environ
    ]
    if missing:
        raise MissingSecret(
            f"secret variable(s) not set in claimd's environment: {', '.join(sorted(missing))}"
        )
    resolved = {target: os.environ[source] for target, source in mapping.items()}
    MASKER.add(resolved.values())
    return resolved


def job_environment(
    spec: ShellSpec, context: RunContext, secrets: Mapping[str, str]
) -> dict[str, str]:
    """What a shell job's process is given, and nothing else of claimd's.

    A small base (PATH, HOME, LANG, TZ, from claimd's own when set), the
    variables the job names in ``inherit_env``, its ``env``, its resolved
    ``secret_env`` and the run's ``CLAIMD_*`` values. Never claimd's settings,
    its API token, the database URL or another job's secret.
    """
    host = os.environ
    env = {name: host[name] for name in BASE_ENV if name in host}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update({name: host[name] for name in spec.inherit_env if name in host})
    env.update(spec.env)
    env.update(secrets)
    env.update(context.env())
    return env


def scrub(result: ExecutionResult, secrets: Iterable[str] = ()) -> ExecutionResult:
    """The result with every secret the replica knows replaced by *** in what is recorded.

    ``secrets``: this run's own, added to the replica's masker
    (actors.observability.secrets) first. A secret cut at the tail's edge is
    masked too.
    """
    MASKER.add(secrets)
    if not len(MASKER):
        return result

    def clean(text: str | None) -> str | None:
        return None if text is None else MASKER.mask_tail(text)

    return dataclasses.replace(
        result, error=clean(result.error), output_tail=clean(result.output_tail)
    )


# claimd's own settings travel in CLAIMD_* variables (the database URL among
# them); a job is told its run in CLAIMD_* variables too, set afresh per run.
CLAIMD_PREFIX = "CLAIMD_"


def python_environment(also_withheld: Iterable[str] = ()) -> dict[str, str]:
    """What a python job's child process starts from: claimd's environment without its
    own settings (every ``CLAIMD_*``), the variables ``also_withheld`` names (the API
    token's) and any variable holding a secret the replica knows (another job's
    ``secret_env``, a token). The run's ``CLAIMD_*`` values are added per run.
    """
    extra = frozenset(also_withheld)
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(CLAIMD_PREFIX) and name not in extra and not MASKER.knows(value)
    }


async def pump_output(read_fd: int, tail: Tail) -> None:
    """Read a job's output pipe into ``tail`` until every writer has closed it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
    )
    try:
        while chunk := await reader.read(65536):
            tail.add(chunk)
    finally:
        transport.close()


async def drain_output(pumping: asyncio.Future[None], limit: float = 2.0) -> None:
    """Let the pump read what is left, up to ``limit`` seconds (a process outside the
    job's group may hold the pipe open; then the pump is cancelled)."""
    try:
        await asyncio.wait_for(pumping, limit)
    except TimeoutError:
        pass
    except Exception as exc:  # noqa: BLE001 - losing the tail must not lose the verdict
        get_logger("executor").warning(
            "output capture failed; the verdict stands without it", error=repr(exc)
        )

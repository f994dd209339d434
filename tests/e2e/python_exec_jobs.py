"""Python job functions the python-job end-to-end tests run through `claimd run`.

They write what they did to the file named by ``PYJOBS_EFFECTS`` (one line per
event, appended whole), since a sync job runs in a child process and an async
one in the replica: the test reads the file, not memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import UTC, datetime

from actors.domain import RunContext

EFFECTS_ENV = "PYJOBS_EFFECTS"
SLEEP_ENV = "PYJOBS_SLEEP_S"


def _note(*words: object) -> None:
    line = " ".join(str(w) for w in words) + "\n"
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write: lines of concurrent writers never mix
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def sleeps_past_its_timeout(ctx: RunContext) -> None:
    """Notes its start (and which earlier executions of its run are still alive), sleeps
    ``PYJOBS_SLEEP_S``, notes its end. Killed at its timeout, it never notes an end."""
    path = os.environ[EFFECTS_ENV]
    earlier: list[int] = []
    with contextlib.suppress(FileNotFoundError), open(path) as effects:
        for line in effects:
            kind, run_id, _, pid, *_ = line.split()
            if kind == "start" and run_id == ctx.run_id and int(pid) != os.getpid():
                earlier.append(int(pid))
    alive = [pid for pid in earlier if _alive(pid)]
    _note("start", ctx.run_id, ctx.attempt, os.getpid(), time.time(), *alive)
    time.sleep(float(os.environ[SLEEP_ENV]))
    _note("end", ctx.run_id, ctx.attempt, os.getpid(), time.time())


async def blocks_its_loop(ctx: RunContext) -> None:
    """An async job that calls time.sleep: it never yields to its event loop."""
    _note("blocker-start", ctx.run_id, ctx.attempt, os.getpid(), time.time())
    time.sleep(float(os.environ[SLEEP_ENV]))  # noqa: ASYNC251 - the very fault under test
    _note("blocker-end", ctx.run_id, ctx.attempt, os.getpid(), time.time())


async def ticks(ctx: RunContext) -> None:
    """Notes when its code began against its instant."""
    began = datetime.now(UTC)
    _note("tick", ctx.run_id, ctx.attempt, ctx.scheduled_at.isoformat(), began.isoformat())


def ticks_sync(ctx: RunContext) -> None:
    """The same note from a sync job (a child process of its own)."""
    began = datetime.now(UTC)
    _note("tick", ctx.run_id, ctx.attempt, ctx.scheduled_at.isoformat(), began.isoformat())


def talks_then_fails_twice(ctx: RunContext) -> None:
    """Prints and logs a line naming its attempt; fails on attempts 1 and 2."""
    print(f"printed by attempt {ctx.attempt}")
    logging.getLogger("talker").warning("logged by attempt %s", ctx.attempt)
    if ctx.attempt < 3:
        raise RuntimeError(f"planned failure of attempt {ctx.attempt}")


def notes_its_process(ctx: RunContext) -> None:
    """A sync job that notes which process ran it (warm children run many attempts)."""
    _note("ran", ctx.run_id, ctx.attempt, os.getpid())

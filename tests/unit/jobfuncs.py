"""Job functions the python executor tests call by ``module:function`` target."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from actors.domain import RunContext

# Each function appends the context it was handed, so a test can see what it got.
SEEN: list[tuple[str, RunContext]] = []


def sync_job(ctx: RunContext) -> None:
    """Runs in a child process: what it saw is in its output, not in SEEN."""
    SEEN.append(("sync", ctx))
    print("sync", ctx.run_id, ctx.attempt, ctx.fencing_token, ctx.scheduled_at.isoformat())
    print("env", os.environ.get("CLAIMD_RUN_ID"), os.environ.get("CLAIMD_DATABASE_URL"))


def talking_job(ctx: RunContext) -> None:
    """Prints, writes to stderr and logs: every line is the attempt's output."""
    print(f"printed by attempt {ctx.attempt}")
    sys.stderr.write("to stderr\n")
    logging.getLogger("talking").info("logged at info")


async def talking_async_job(ctx: RunContext) -> None:
    await asyncio.sleep(0)
    print(f"printed by attempt {ctx.attempt}")
    sys.stderr.write("to stderr\n")
    logging.getLogger("talking").warning("logged at warning")


def sleeping_job(ctx: RunContext) -> None:
    """Writes its pid to the file JOBFUNCS_PID_FILE names, then outlives any timeout."""
    Path(os.environ["JOBFUNCS_PID_FILE"]).write_text(str(os.getpid()))
    print("about to sleep", flush=True)
    time.sleep(300)


async def async_job(ctx: RunContext) -> None:
    await asyncio.sleep(0)
    SEEN.append(("async", ctx))


def failing_job(ctx: RunContext) -> None:
    raise RuntimeError(f"export for {ctx.job} broke")


async def failing_async_job(ctx: RunContext) -> None:
    await asyncio.sleep(0)
    raise ValueError("bad input for attempt " + str(ctx.attempt))


async def slow_async_job(ctx: RunContext) -> None:
    SEEN.append(("slow-start", ctx))
    await asyncio.sleep(60)
    SEEN.append(("slow-end", ctx))  # never reached: the timeout cancels the sleep


NOT_CALLABLE = 42


def leaking_job(ctx: RunContext) -> None:
    """Fails quoting a secret of claimd's environment (another job's) in its error."""
    import os

    raise RuntimeError("cannot use " + os.environ["CLAIMD_TEST_LEAKED_SECRET"])


async def leaking_async_job(ctx: RunContext) -> None:
    """The same in the replica's process (async), where claimd's environment is readable."""
    await asyncio.sleep(0)
    raise RuntimeError("cannot use " + os.environ["CLAIMD_TEST_LEAKED_SECRET"])


def pid_job(ctx: RunContext) -> None:
    """Prints the pid of the process it ran in, and its attempt."""
    print(f"pid {os.getpid()} attempt {ctx.attempt}")


def crashing_job(ctx: RunContext) -> None:
    """Ends its process outright, mid-attempt, after a line of output."""
    print(f"pid {os.getpid()} about to crash", flush=True)
    os._exit(3)


def thread_leaving_job(ctx: RunContext) -> None:
    """Returns, leaving a thread that prints after the attempt ended."""
    import threading

    def late() -> None:
        time.sleep(0.3)
        print("late line from a thread the attempt left", flush=True)

    threading.Thread(target=late).start()
    print(f"pid {os.getpid()} left a thread")


def echoing_job(ctx: RunContext) -> None:
    """Prints from python, from a program it runs, and to stderr without a newline."""
    import subprocess

    print(f"pid {os.getpid()} python {ctx.attempt}", flush=True)
    subprocess.run(["/bin/echo", f"echo {ctx.attempt}"], check=True)
    sys.stderr.write(f"stderr {ctx.attempt}")


def process_leaving_job(ctx: RunContext) -> None:
    """Returns, leaving a program that prints after the attempt ended."""
    import subprocess

    subprocess.Popen(["/bin/sh", "-c", "sleep 0.3; echo late line from a process left"])
    print(f"pid {os.getpid()} left a process")


def pipe_replacing_job(ctx: RunContext) -> None:
    """Closes every copy of its output pipe above fd 2 and puts /dev/null in its place
    (as a job closing the descriptors it did not open would)."""
    ours = os.readlink("/proc/self/fd/1")
    null = os.open(os.devnull, os.O_WRONLY)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and fd != null and os.readlink(f"/proc/self/fd/{fd}") == ours:
                os.dup2(null, fd)
        except OSError:
            pass  # the listing's own descriptor, gone
    os.close(null)
    print(f"pid {os.getpid()} replaced its output pipe's copies")

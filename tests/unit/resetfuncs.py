"""Jobs that change what a warm child resets between attempts, and jobs that look at it.

A test runs a changing job, then a looking one, in the same child
(``test_warm_child_reset.py``): the looking job must see none of the change.
"""

from __future__ import annotations

import _thread
import ctypes
import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from actors.domain import RunContext

RESET = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGALRM)


def _pid(ctx: RunContext) -> None:
    print(f"pid {os.getpid()} attempt {ctx.attempt}")


# --- the environment ---------------------------------------------------------------


def environ_changing_job(ctx: RunContext) -> None:
    """Through os.environ: a new variable, a base one changed, one removed, a run's one
    changed."""
    _pid(ctx)
    os.environ["RESET_LEFT"] = "left by attempt 1"
    os.environ["RESET_BASE"] = "changed"
    del os.environ["RESET_GONE"]
    os.environ["CLAIMD_JOB"] = "changed"


def environ_rebinding_job(ctx: RunContext) -> None:
    """os.environ replaced by a plain dict (the process's environment left as it was)."""
    _pid(ctx)
    os.environ = {"RESET_LEFT": "left by attempt 1"}  # type: ignore[assignment]  # noqa: B003


def environ_deleting_job(ctx: RunContext) -> None:
    """os.environ gone from the os module."""
    _pid(ctx)
    del os.environ


def environ_looking_job(ctx: RunContext) -> None:
    """The variables the tests name, as python sees them and as a program it starts does."""
    _pid(ctx)
    names = (
        "RESET_LEFT", "RESET_BASE", "RESET_GONE", "CLAIMD_JOB", "CLAIMD_ATTEMPT", "TRACEPARENT",
    )  # fmt: skip
    print("python", {name: os.environ.get(name) for name in names})
    shown = subprocess.run(["/usr/bin/env"], capture_output=True, text=True, check=True).stdout
    found = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    print("program", {name: found.get(name) for name in names})


# --- sys.stdout, sys.stderr, the root logger -------------------------------------


def _replace_streams() -> None:
    sys.stdout = io.StringIO()
    sys.stderr = io.StringIO()


def _reconfigure_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        assert isinstance(stream, io.TextIOWrapper)
        stream.reconfigure(newline="\r\n")


def _handler() -> logging.Handler:
    return logging.getLogger().handlers[0]


STREAM_CHANGES = {
    "replaced": lambda: _replace_streams(),
    "reconfigured": lambda: _reconfigure_streams(),
    "closed": lambda: sys.stdout.close(),
    "detached": lambda: sys.stderr.detach(),  # type: ignore[union-attr]
    "write replaced": lambda: setattr(sys.stdout, "write", lambda text: len(text)),
    "root level": lambda: logging.getLogger().setLevel(logging.ERROR),
    "root filter": lambda: logging.getLogger().addFilter(lambda record: False),
    "root disabled": lambda: setattr(logging.getLogger(), "disabled", True),
    "root handlers": lambda: logging.getLogger().handlers.append(logging.NullHandler()),
    "handler level": lambda: _handler().setLevel(logging.CRITICAL),
    "handler filter": lambda: _handler().addFilter(lambda record: False),
    "handler stream": lambda: _handler().setStream(io.StringIO()),  # type: ignore[attr-defined]
    "handler terminator": lambda: setattr(_handler(), "terminator", " END"),
    "formatter": lambda: _handler().setFormatter(logging.Formatter("other %(message)s")),
    "format": lambda: setattr(_handler().formatter._style, "_fmt", "other %(message)s"),  # type: ignore[union-attr]
    "nonblocking": lambda: os.set_blocking(1, False),
    "stdout deleted": lambda: delattr(sys, "stdout"),
    "not a formatter": lambda: setattr(_handler(), "formatter", object()),
}


def streams_changing_job(ctx: RunContext) -> None:
    """Changes what the environment variable RESET_CHANGE names (``STREAM_CHANGES``)."""
    _pid(ctx)
    STREAM_CHANGES[os.environ["RESET_CHANGE"]]()


def streams_looking_job(ctx: RunContext) -> None:
    _pid(ctx)
    print("printed", end="\n")
    sys.stderr.write("to stderr\n")
    logging.getLogger("look").info("logged")
    logging.info("logged on the root logger")  # its own filters and disabled apply
    print(f"handlers {len(logging.getLogger().handlers)} blocking {os.get_blocking(1)}")


# --- signals, the alarm, the working directory -------------------------------------


def signals_changing_job(ctx: RunContext) -> None:
    """A handler for each reset signal (SIGTERM's set by the C library: python's own table
    still says SIG_DFL), an alarm, another working directory."""
    _pid(ctx)
    for sig in RESET:
        if sig != signal.SIGTERM:
            signal.signal(sig, lambda *_: None)
    ctypes.CDLL(None).signal(signal.SIGTERM, 1)  # SIG_IGN, behind python's back
    signal.alarm(600)
    os.chdir("/")


def signals_looking_job(ctx: RunContext) -> None:
    """The kernel's own view (/proc/self/status): the reset signals neither ignored nor
    caught; the alarm pending, in seconds; the working directory."""
    _pid(ctx)
    status = dict(
        line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines()
    )
    ignored, caught = int(status["SigIgn"], 16), int(status["SigCgt"], 16)
    odd = [sig.name for sig in RESET if (ignored | caught) >> (sig - 1) & 1]
    print(f"not default {odd} alarm {signal.alarm(0)} cwd {os.getcwd()}")


# --- what an attempt leaves running ------------------------------------------------


def raw_thread_leaving_job(ctx: RunContext) -> None:
    """A thread started below ``threading`` (it does not count it)."""
    _pid(ctx)
    _thread.start_new_thread(time.sleep, (30,))


def orphan_leaving_job(ctx: RunContext) -> None:
    """A program whose parent ended: an orphan, given to the child (its subreaper)."""
    _pid(ctx)
    shown = subprocess.run(
        ["/bin/sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(f"orphan {shown.stdout.strip()}")


def zombie_leaving_job(ctx: RunContext) -> None:
    """A child that ended, not reaped by the job: nothing of it runs (the child is reused)."""
    _pid(ctx)
    child = subprocess.Popen(["/bin/true"])
    deadline = time.monotonic() + 30
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rpartition(")")[2].split()[0] != "Z":
        if time.monotonic() > deadline:
            raise TimeoutError("/bin/true did not end")
        time.sleep(0.01)
    child.returncode = 0  # Popen's finalizer leaves it alone: the child reaps it


def task_view_replacing_job(ctx: RunContext) -> None:
    """Leaves a thread, and puts a directory of 3 links (as /proc/self/task has with one
    thread) in place of the child's own descriptor of /proc/self/task."""
    _pid(ctx)
    ours = f"/proc/{os.getpid()}/task"
    folder = Path(os.environ["RESET_FOLDER"])
    (folder / "one").mkdir(exist_ok=True)
    other = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    assert os.fstat(other).st_nlink == 3
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == ours:
                os.dup2(other, int(name))
        except OSError:
            pass  # the listing's own descriptor, gone
    os.close(other)
    _thread.start_new_thread(time.sleep, (30,))

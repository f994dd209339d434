"""A warm child of the fork server: one process that runs many sync python attempts in turn.

Forked by the fork server (``zygote.py``) into a session (process group) of
its own, it waits on a SEQPACKET socket shared with the worker. Each request is
``(target, context, env_version, env, cwd, marker)`` (``env`` None when this
child has that version already). The first comes with one file descriptor, the
write end of this child's output pipe for its life, and ``marker``, the bytes
that end an attempt's output in it (random per child: ``child_output.py``); the
later ones come with neither. Fds 1 and 2 (and a ``logging`` handler on the
root logger) write to the pipe while ``func(ctx)`` runs; then they are pointed
at /dev/null again, so nothing this process does between attempts (a late flush
of a job's own file object) reaches the pipe. An attempt this child is reused
after ends its output with the marker, written once nothing of the attempt
runs any more (so nothing of it can follow the marker), and the verdict goes
back on the socket: ``("done", verdict, reusable)``. An attempt it is not
reused after writes no marker: the worker reads its output to the pipe's end.

``reusable`` is False when the attempt left something running in this process
(a thread) or below it (a child process, or an orphan of one: the child is
their subreaper): the child then exits, and the fork server's sweep of its
group (SIGKILL) ends what the attempt left, before the worker hands the
verdict on. An attempt's leftovers never run beside the next attempt.

A job's module is imported once per child (most often inherited from the fork
server, which imports it before it forks), and imported again here when its
file changed (size or modification time), as the fork server does.

Standard library only (and ``log_context``, which is): this runs in the fork server's
children.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import logging
import os
import pickle
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

from actors.adapters.executors import log_context

VERDICT_LIMIT = 4096
MESSAGE_LIMIT = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36


def resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    func = getattr(importlib.import_module(module_name), attr)
    if not callable(func):
        raise TypeError(f"{target} is not callable")
    return func


# module -> its file's (mtime, size) when imported here: an edited module is
# imported again (as a reload of the config imports it again in the replica).
_STAMPS: dict[str, tuple[int, int] | None] = {}


def _stamp(module: Any) -> tuple[int, int] | None:
    path = getattr(module, "__file__", None)
    try:
        found = os.stat(path) if path else None
    except OSError:
        return None
    return None if found is None else (found.st_mtime_ns, found.st_size)


def preload(target: str) -> None:
    """Import the job's module here, once per version of its file."""
    name = target.partition(":")[0]
    with contextlib.suppress(Exception):  # the attempt reports the import's error itself
        module = sys.modules.get(name)
        if module is None:
            module = importlib.import_module(name)
        elif name in _STAMPS and _stamp(module) != _STAMPS[name]:
            module = importlib.reload(module)
        _STAMPS[name] = _stamp(module)


def _become_subreaper() -> None:
    """Orphans of the job's processes become this child's, so :func:`_alone` sees them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _alone() -> bool:
    """Whether nothing the attempt started still runs: one thread, no child process.

    Without /proc (not Linux) this cannot be told: the child is not reused.
    """
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # the job's ended children, reaped
            pass
    try:
        tasks = os.listdir("/proc/self/task")
        if len(tasks) != 1:
            return False
        with open(f"/proc/self/task/{tasks[0]}/children", "rb") as found:
            return not found.read().strip()
    except OSError:
        return False


def _streams() -> None:
    """sys.stdout and sys.stderr on fds 1 and 2, line-buffered (a kill loses at most a
    partial line), and the root logger writing to stderr: set again for each attempt,
    whatever the last one did to them."""
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), line_buffering=True, errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace"
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_context.FORMAT))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.INFO)


class _Environment:
    """The attempt's environment: the base the worker sent (once per version) plus the
    run's ``CLAIMD_*`` variables, set afresh whatever the last attempt changed."""

    def __init__(self) -> None:
        self.base: dict[str, str] = {}
        self.last: dict[str, str] | None = None

    def set(self, base: dict[str, str] | None, run: dict[str, str]) -> None:
        if base is not None:
            self.base, self.last = base, None
        wanted = {**self.base, **run}
        if self.last is not None and self.last.keys() == wanted.keys() and os.environ == self.last:
            os.environ.update(run)  # only the run's variables differ from the last attempt's
        else:
            os.environ.clear()
            os.environ.update(wanted)
        self.last = wanted


def _attempt(
    request: tuple[Any, ...], out_fd: int, null: int, home: str, env: _Environment
) -> dict[str, Any]:
    target, context, _, base, cwd, _ = request
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    try:
        env.set(base, context.env())
        log_context.set_process_run(context.job, context.run_id)
        os.chdir(cwd or home)
        _default_signals()
        _streams()
        preload(target)
        try:
            resolve(target)(context)
            verdict: dict[str, Any] = {"outcome": "succeeded"}
        except BaseException as exc:  # noqa: BLE001 - the job's failure is its verdict
            traceback.print_exc()
            verdict = {"outcome": "failed", "error": repr(exc)[:1000]}
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        return verdict
    finally:
        # The attempt's output ends here (its marker follows, when this child is reused).
        os.dup2(null, 1)
        os.dup2(null, 2)


def _identity(fd: int) -> tuple[int, int]:
    found = os.fstat(fd)
    return found.st_dev, found.st_ino


def _end_output(out_fd: int, pipe: tuple[int, int], marker: bytes) -> bool:
    """Write the attempt's end to the output pipe; False when this cannot be done (the job
    closed or replaced this process's copy of the pipe): then the child is not reused."""
    try:
        if _identity(out_fd) != pipe:
            return False
        if not os.get_blocking(out_fd):
            os.set_blocking(out_fd, True)  # the job set O_NONBLOCK on fd 1 (the same file)
        os.write(out_fd, marker)  # under PIPE_BUF: written whole, or not at all
    except OSError:
        return False
    return True


_RESET = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGALRM)


def _default_signals() -> None:
    """Whatever handlers the last attempt installed, this one starts from the defaults
    (a SIGTERM at its timeout ends it at once; an alarm the last one set is gone)."""
    signal.alarm(0)
    for sig in _RESET:
        signal.signal(sig, signal.SIG_DFL)


def serve(sock: socket.socket, keep_closed: list[int]) -> NoReturn:
    """In the forked child: attempts until the socket closes; never returns."""
    code = 0
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        _default_signals()
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        _become_subreaper()
        log_context.install()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        home = os.getcwd()
        env = _Environment()
        sock.setblocking(True)
        out_fd, marker, pipe = -1, b"", (0, 0)
        while True:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_LIMIT, 1)
            if not data:
                break  # the worker is gone (or let this child go)
            if len(fds) != (1 if out_fd < 0 else 0):
                for fd in fds:
                    os.close(fd)
                break
            request = pickle.loads(data)
            if out_fd < 0:  # the first attempt: the output pipe, for this child's life
                out_fd, marker = fds[0], request[5]
                os.set_inheritable(out_fd, False)  # the job's programs get fds 1 and 2 only
                pipe = _identity(out_fd)
            verdict = _attempt(request, out_fd, null, home, env)
            reusable = _alone() and _end_output(out_fd, pipe, marker)
            answer = pickle.dumps(("done", verdict, reusable))
            if len(answer) > VERDICT_LIMIT:
                answer = pickle.dumps(("done", {"outcome": verdict["outcome"]}, reusable))
            sock.sendall(answer)
            if not reusable:
                break
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        code = 70
    os._exit(code)

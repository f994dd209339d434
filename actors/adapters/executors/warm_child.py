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

Before each attempt, what the last one could leave to it is set again: its
environment, working directory, sys.stdout and sys.stderr, root logger, signal
handlers and alarm (``warm_reset.py``: only what it changed, found by exact
checks; setting all of it anew was about 40 % of a child's CPU per no-op).

``reusable`` is False when the attempt left something running in this process
(a thread) or below it (a child process, or an orphan of one: the child is
their subreaper): the child then exits, and the fork server's sweep of its
group (SIGKILL) ends what the attempt left, before the worker hands the
verdict on. An attempt's leftovers never run beside the next attempt.

A job's module is imported once per child (most often inherited from the fork
server, which imports it before it forks), and imported again here when its
file changed (size or modification time), as the fork server does.

Standard library only (and ``log_context`` and ``warm_reset``, which are): this runs
in the fork server's children.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import mmap
import os
import pickle
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

from actors.adapters.executors import log_context, warm_reset

VERDICT_LIMIT = 4096
MESSAGE_LIMIT = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36
_FD_BYTES = 4  # an int, as SCM_RIGHTS carries descriptors


def resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    # Most often imported already (preload): import_module's own lookup costs more.
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    func = getattr(module, attr)
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
    """Import the job's module here, once per version of its file.

    The file is looked at (one ``stat``) before every attempt: an edit is seen
    by the next attempt, however soon. The stamp kept is the one taken before
    a reload, so an edit made while it ran is seen by the attempt after.
    """
    name = target.partition(":")[0]
    with contextlib.suppress(Exception):  # the attempt reports the import's error itself
        module = sys.modules.get(name)
        if module is None:
            module = importlib.import_module(name)
            _STAMPS[name] = _stamp(module)
            return
        stamp = _stamp(module)
        if name in _STAMPS and stamp != _STAMPS[name]:
            importlib.reload(module)
        _STAMPS[name] = stamp


def _become_subreaper() -> None:
    """Orphans of the job's processes become this child's, so :func:`_alone` sees them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


_WALL = 0x40000000  # __WALL: children whose exit signal is not SIGCHLD (clone) too
_TASKS = "/proc/self/task"


def _alone(tasks: tuple[int, tuple[int, int]] | None) -> bool:
    """Whether nothing the attempt started still runs: no child process, one thread.

    No child: ``waitpid(-1, WNOHANG)`` reaps the job's ended children, then
    fails with ECHILD when this process has none left, an orphan of theirs
    included (it is given to this subreaper, and is a child like another; one
    still running answers 0). One thread: the link count of /proc/self/task is 2
    plus its threads on Linux, read by one ``fstat`` of it held open (``tasks``:
    its descriptor and identity, from :func:`_tasks`; the identity, in case the
    job closed it and the number now names another file); else the directory
    is listed. Without /proc this cannot be told: the child is not reused.
    """
    try:
        while os.waitpid(-1, os.WNOHANG | _WALL)[0]:  # the job's ended children, reaped
            pass
        return False  # a child of this process still runs
    except ChildProcessError:
        pass
    try:
        if tasks is None:
            return len(os.listdir(_TASKS)) == 1
        found = os.fstat(tasks[0])
        return (found.st_dev, found.st_ino) == tasks[1] and found.st_nlink == 3
    except OSError:
        return False


def _tasks() -> tuple[int, tuple[int, int]] | None:
    """/proc/self/task held open, if its link count tells the threads (3 with this one, as
    Linux has it: 2 plus the threads); None if not (:func:`_alone` lists the tasks then)."""
    try:
        fd = os.open(_TASKS, os.O_RDONLY | os.O_DIRECTORY)  # not inherited (PEP 446)
        found = os.fstat(fd)
        if len(os.listdir(_TASKS)) == 1 and found.st_nlink == 3:
            return fd, (found.st_dev, found.st_ino)
        os.close(fd)
    except OSError:
        pass
    return None


_SUCCEEDED: dict[str, Any] = {"outcome": "succeeded"}
# The answer to most attempts, made once.
_ANSWER_SUCCEEDED = pickle.dumps(("done", _SUCCEEDED, True))


def _attempt(
    request: tuple[Any, ...], out_fd: int, null: int, home: str, state: _State
) -> dict[str, Any]:
    target, context, _, base, cwd, _ = request
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    try:
        state.env.set(base, context.env())
        log_context.set_process_run(context.job, context.run_id)
        os.chdir(cwd or home)
        warm_reset.default_signals()
        state.streams.set()
        preload(target)
        try:
            resolve(target)(context)
            verdict = _SUCCEEDED
        except BaseException as exc:  # noqa: BLE001 - the job's failure is its verdict
            traceback.print_exc()
            verdict = {"outcome": "failed", "error": repr(exc)[:1000]}
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - what is left unwritten must not reach the next
            state.streams.out = None  # attempt's output through a kept stream: new ones
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


class _State:
    """What this child resets before each attempt, and what it knows of its process."""

    def __init__(self) -> None:
        self.env = warm_reset.Environment()
        self.streams = warm_reset.Streams()
        self.tasks = _tasks()


def _receive(sock: socket.socket, buffer: memoryview) -> tuple[int, list[int]]:
    """One request into ``buffer``: its size, and the descriptors that came with it."""
    size, ancillary, _, _ = sock.recvmsg_into([buffer], socket.CMSG_LEN(_FD_BYTES))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_BYTES
            fds.extend(
                int.from_bytes(data[i : i + _FD_BYTES], sys.byteorder)
                for i in range(0, usable, _FD_BYTES)
            )
    return size, fds


def serve(sock: socket.socket, keep_closed: list[int]) -> NoReturn:
    """In the forked child: attempts until the socket closes; never returns."""
    code = 0
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        warm_reset.default_signals()
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        _become_subreaper()
        log_context.install()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        home = os.getcwd()
        state = _State()
        sock.setblocking(True)
        # Requests are read into one buffer: a new 1 MiB bytes object per request cost
        # more than the rest of the read (and 2 page faults). Pages never written to
        # take no memory.
        buffer = memoryview(mmap.mmap(-1, MESSAGE_LIMIT))
        out_fd, marker, pipe = -1, b"", (0, 0)
        while True:
            size, fds = _receive(sock, buffer)
            if not size:
                break  # the worker is gone (or let this child go)
            if len(fds) != (1 if out_fd < 0 else 0):
                for fd in fds:
                    os.close(fd)
                break
            request = pickle.loads(buffer[:size])
            if out_fd < 0:  # the first attempt: the output pipe, for this child's life
                out_fd, marker = fds[0], request[5]
                os.set_inheritable(out_fd, False)  # the job's programs get fds 1 and 2 only
                pipe = _identity(out_fd)
            verdict = _attempt(request, out_fd, null, home, state)
            reusable = _alone(state.tasks) and _end_output(out_fd, pipe, marker)
            if verdict is _SUCCEEDED and reusable:
                answer = _ANSWER_SUCCEEDED
            else:
                answer = pickle.dumps(("done", verdict, reusable))
            if len(answer) > VERDICT_LIMIT:
                answer = pickle.dumps(("done", {"outcome": verdict["outcome"]}, reusable))
            sock.sendall(answer)
            if not reusable:
                break
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        code = 70
    os._exit(code)

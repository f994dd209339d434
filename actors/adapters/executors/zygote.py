"""The fork server: a process that imports job modules once and forks a child per run.

Started by the worker (``python -m actors.adapters.executors.zygote FD``) with
the job environment (claimd's own settings and secrets left out), it reads
requests on a SEQPACKET socket and answers with events:

- ``("run", id, target, context, env, cwd)`` with two file descriptors (the
  output pipe and the verdict pipe): fork a child in a session (process group)
  of its own; answer ``("pid", id, pid)``.
- ``("kill", id, signal)``: signal the child's process group while it is not
  yet reaped (a reaped child's pid is never signalled: it may be reused).
- A fork that fails answers ``("failed", id, why)``: that run fails.
- When a child ends: sweep its group with SIGKILL (nothing it left behind
  lingers), answer ``("exit", id, wait status)``.

A closed socket (the worker is gone) kills every child's group and ends the
server: no execution outlives the worker that would record it.

The child: stdin from /dev/null, stdout and stderr (and a ``logging`` handler
on the root logger) to the output pipe, the run's environment, then
``func(ctx)``; its verdict (pickled) goes to the verdict pipe.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import pickle
import selectors
import signal
import socket
import sys
import traceback
from typing import Any

VERDICT_LIMIT = 4096
MESSAGE_LIMIT = 1 << 20


def _resolve(target: str) -> Any:
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


def _preload(target: str) -> None:
    """Import the job's module here, once per version of its file: every child forked
    after has it."""
    name = target.partition(":")[0]
    with contextlib.suppress(Exception):  # the child reports the import's error itself
        module = sys.modules.get(name)
        if module is None:
            module = importlib.import_module(name)
        elif name in _STAMPS and _stamp(module) != _STAMPS[name]:
            module = importlib.reload(module)
        _STAMPS[name] = _stamp(module)


def _child(request: tuple[Any, ...], out_fd: int, verdict_fd: int, keep_closed: list[int]) -> None:
    """In the forked child: never returns."""
    _, _, target, context, env, cwd = request
    code = 0
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        # Line-buffered: a child killed at its timeout loses at most a partial line.
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), line_buffering=True, errors="backslashreplace"
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace"
        )
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        verdict: dict[str, Any]
        try:
            _resolve(target)(context)
            verdict = {"outcome": "succeeded"}
        except BaseException as exc:  # noqa: BLE001 - the job's failure is its verdict
            traceback.print_exc()
            verdict = {"outcome": "failed", "error": repr(exc)[:1000]}
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os.write(verdict_fd, pickle.dumps(verdict)[:VERDICT_LIMIT])
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        code = 70
    os._exit(code)


class ForkServer:
    """The server's loop: requests in, children out, their ends reported."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, str] = {}  # pid -> request id, until reaped
        self.pids: dict[str, int] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.selector = selectors.DefaultSelector()

    def send(self, event: tuple[Any, ...]) -> None:
        self.sock.sendall(pickle.dumps(event))

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the worker's to handle
        signal.signal(signal.SIGTERM, self._terminated)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.sock:
                    if not self.receive():
                        self.kill_all()
                        return
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass
                self.reap()

    def receive(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_LIMIT, 2)
        except InterruptedError:
            return True
        except OSError:
            return False
        if not data:
            return False
        request = pickle.loads(data)
        if request[0] == "run":
            self.fork(request, fds)
        elif request[0] == "kill":
            for fd in fds:
                os.close(fd)
            pid = self.pids.get(request[1])
            if pid is not None:
                _signal_group(pid, request[2])
        return True

    def fork(self, request: tuple[Any, ...], fds: list[int]) -> None:
        run_key = request[1]
        out_fd, verdict_fd = fds
        _preload(request[2])
        try:
            pid = os.fork()
        except OSError as exc:  # no process to be had (a limit): this run fails, not the server
            os.close(out_fd)
            os.close(verdict_fd)
            self.send(("failed", run_key, f"cannot fork the job's process: {exc}"))
            return
        if pid == 0:
            _child(
                request,
                out_fd,
                verdict_fd,
                [self.sock.fileno(), self.wake_r, self.wake_w, self.selector.fileno()],
            )
        os.close(out_fd)
        os.close(verdict_fd)
        self.children[pid] = run_key
        self.pids[run_key] = pid
        self.send(("pid", run_key, pid))

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run_key = self.children.pop(pid, None)
            # Whatever the child left behind in its group goes with it.
            _signal_group(pid, signal.SIGKILL, leader_too=False)
            if run_key is not None:
                self.pids.pop(run_key, None)
                self.send(("exit", run_key, status))

    def _terminated(self, *_: object) -> None:
        """SIGTERM (the worker replaces this server): no child outlives it."""
        self.kill_all()
        os._exit(0)

    def kill_all(self) -> None:
        for pid in list(self.children):
            _signal_group(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _signal_group(pid: int, sig: int, *, leader_too: bool = True) -> None:
    """Signal the child's process group; before its setsid, the child alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        if leader_too:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    except PermissionError:
        pass


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    # The worker's import path, so job modules import here as they do there.
    sys.path[:] = pickle.loads(bytes.fromhex(sys.argv[2]))
    importlib.import_module("actors.domain")  # what every context unpickles into
    ForkServer(sock).serve()


if __name__ == "__main__":
    main()

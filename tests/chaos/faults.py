"""What the harness does to the system: the seeded fault plan, the servers, the replicas."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from random import Random

from actors.adapters.embedded import EmbeddedNats, EmbeddedPostgres
from tests.chaos import broken
from tests.chaos.broken import Faults

REPO_ROOT = Path(__file__).resolve().parents[2]


class FaultKind(enum.StrEnum):
    KILL = "kill"
    ZOMBIE = "zombie"
    NATS_RESTART = "nats_restart"
    PG_RESTART = "pg_restart"
    PUBLISH_FAILURES = "publish_failures"
    SLOW_COMPLETIONS = "slow_completions"
    # Network faults, through the replica's own proxies (tests/chaos/proxy.py).
    DB_BLACKHOLE = "db_blackhole"
    NATS_BLACKHOLE = "nats_blackhole"
    LINKS_BLACKHOLE = "links_blackhole"
    LINK_RESETS = "link_resets"
    LINK_SLOW = "link_slow"
    STOP_BLACKHOLED = "stop_blackholed"

    @property
    def label(self) -> str:
        return FAULT_LABELS[self]

    @property
    def network(self) -> bool:
        return self in NETWORK_KINDS

    @property
    def links(self) -> tuple[str, ...]:
        """The links of the target replica this fault acts on ("db", "nats")."""
        return FAULT_LINKS.get(self, ())


FAULT_LABELS = {
    FaultKind.KILL: "replica SIGKILL, restarted after a delay",
    FaultKind.ZOMBIE: "replica SIGSTOP past its lease, then SIGCONT",
    FaultKind.NATS_RESTART: "nats-server SIGKILL, restarted",
    FaultKind.PG_RESTART: "PostgreSQL stopped, restarted",
    FaultKind.PUBLISH_FAILURES: "publish failures (extra replica)",
    FaultKind.SLOW_COMPLETIONS: "slow completions (extra replica)",
    FaultKind.DB_BLACKHOLE: "DB link blackholed past the lease",
    FaultKind.NATS_BLACKHOLE: "NATS link blackholed past the lease",
    FaultKind.LINKS_BLACKHOLE: "both links blackholed past the lease",
    FaultKind.LINK_RESETS: "both links reset repeatedly",
    FaultKind.LINK_SLOW: "both links slow (added latency)",
    FaultKind.STOP_BLACKHOLED: "SIGTERM while both links blackholed (extra)",
}
PROCESS_KINDS = [
    FaultKind.KILL,
    FaultKind.ZOMBIE,
    FaultKind.NATS_RESTART,
    FaultKind.PG_RESTART,
    FaultKind.PUBLISH_FAILURES,
    FaultKind.SLOW_COMPLETIONS,
]
NETWORK_KINDS = [
    FaultKind.DB_BLACKHOLE,
    FaultKind.NATS_BLACKHOLE,
    FaultKind.LINKS_BLACKHOLE,
    FaultKind.LINK_RESETS,
    FaultKind.LINK_SLOW,
    FaultKind.STOP_BLACKHOLED,
]
FAULT_LINKS = {
    FaultKind.DB_BLACKHOLE: ("db",),
    FaultKind.NATS_BLACKHOLE: ("nats",),
    FaultKind.LINKS_BLACKHOLE: ("db", "nats"),
    FaultKind.LINK_RESETS: ("db", "nats"),
    FaultKind.LINK_SLOW: ("db", "nats"),
    FaultKind.STOP_BLACKHOLED: ("db", "nats"),
}
# The random part of a plan favours the faults that hit runs in flight.
WEIGHTS = {
    FaultKind.KILL: 3,
    FaultKind.ZOMBIE: 2,
    FaultKind.NATS_RESTART: 1,
    FaultKind.PG_RESTART: 1,
    FaultKind.PUBLISH_FAILURES: 1,
    FaultKind.SLOW_COMPLETIONS: 1,
    FaultKind.DB_BLACKHOLE: 2,
    FaultKind.NATS_BLACKHOLE: 2,
    FaultKind.LINKS_BLACKHOLE: 2,
    FaultKind.LINK_RESETS: 2,
    FaultKind.LINK_SLOW: 1,
    FaultKind.STOP_BLACKHOLED: 1,
}


@dataclass(frozen=True)
class Fault:
    """One planned fault: when (seconds after injection starts), how long, on whom."""

    kind: FaultKind
    at: float
    span: float  # down time, pause, restart delay or the period the faulty replica lives
    target: int  # replica index (kill, zombie)
    # publish: fail every Nth; slow completions: seconds added to every execution;
    # resets: seconds between resets; slow links: latency each way; SIGTERM
    # while blackholed: seconds blackholed before the signal.
    param: float = 0.0

    def describe(self) -> str:
        # fmt: off
        what = {
            FaultKind.KILL: f"SIGKILL replica r{self.target}, restart after {self.span:.1f}s",
            FaultKind.ZOMBIE: f"SIGSTOP replica r{self.target} for {self.span:.1f}s",
            FaultKind.NATS_RESTART: f"nats-server down {self.span:.1f}s",
            FaultKind.PG_RESTART: f"PostgreSQL down {self.span:.1f}s",
            FaultKind.PUBLISH_FAILURES:
                f"extra replica failing 1 publish in {int(self.param)} for {self.span:.1f}s",
            FaultKind.SLOW_COMPLETIONS:
                f"extra replica adding {self.param:.1f}s to every run for {self.span:.1f}s",
            FaultKind.DB_BLACKHOLE: f"blackhole r{self.target}'s DB link for {self.span:.1f}s",
            FaultKind.NATS_BLACKHOLE:
                f"blackhole r{self.target}'s NATS link for {self.span:.1f}s",
            FaultKind.LINKS_BLACKHOLE:
                f"blackhole both of r{self.target}'s links for {self.span:.1f}s",
            FaultKind.LINK_RESETS:
                f"reset r{self.target}'s links every {self.param:.1f}s for {self.span:.1f}s",
            FaultKind.LINK_SLOW:
                f"slow r{self.target}'s links by {self.param * 1000:.0f}ms each way "
                f"for {self.span:.1f}s",
            FaultKind.STOP_BLACKHOLED:
                f"extra replica: blackhole both links, SIGTERM {self.param:.1f}s later",
        }[self.kind]
        # fmt: on
        return f"t+{self.at:5.1f}s {what}"


def build_plan(
    seed: int,
    kinds: list[FaultKind],
    duration: float,
    replicas: int,
    lease: float,
    *,
    force_each: bool = True,
    warmup: float = 3.0,
) -> list[Fault]:
    """A reproducible fault plan: one fault at a time, with gaps between them.

    With ``force_each`` every kind in ``kinds`` appears at least once (even if
    that runs past ``duration``); the rest of the time is filled at random.
    """
    rng = Random(seed)
    forced = list(kinds) if force_each else []
    rng.shuffle(forced)
    plan: list[Fault] = []
    t = warmup
    while kinds:
        is_forced = bool(forced)
        kind = forced.pop(0) if forced else rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        span, param = _span_and_param(rng, kind, lease)
        target = rng.randrange(replicas)
        if not is_forced and t + span > duration:
            break
        plan.append(Fault(kind, round(t, 2), round(span, 2), target, round(param, 2)))
        t += span + rng.uniform(2.0, 5.0)
    return plan


def _span_and_param(rng: Random, kind: FaultKind, lease: float) -> tuple[float, float]:
    if kind is FaultKind.KILL:
        return rng.uniform(2.0, 6.0), 0.0
    if kind is FaultKind.ZOMBIE:
        # Past the lease, but not by much: the run's newer attempt is then
        # usually still executing when the zombie wakes, the case fencing is for.
        return lease + rng.uniform(1.5, 2.5), 0.0
    if kind in (FaultKind.NATS_RESTART, FaultKind.PG_RESTART):
        return rng.uniform(1.5, 3.5), 0.0
    if kind is FaultKind.PUBLISH_FAILURES:
        return rng.uniform(6.0, 10.0), float(rng.choice([2, 3, 4]))
    if kind in (FaultKind.DB_BLACKHOLE, FaultKind.NATS_BLACKHOLE, FaultKind.LINKS_BLACKHOLE):
        # Longer than the lease: the runs in flight behind the dead link lose
        # their leases, and the replica must have noticed long before the heal.
        return lease + rng.uniform(2.0, 4.0), 0.0
    if kind is FaultKind.LINK_RESETS:
        return rng.uniform(6.0, 9.0), rng.uniform(0.7, 1.5)
    if kind is FaultKind.LINK_SLOW:
        # Round trips of 0.1-0.4 s: slow, but inside the statement timeouts.
        return rng.uniform(5.0, 8.0), rng.uniform(0.05, 0.2)
    if kind is FaultKind.STOP_BLACKHOLED:
        # The span is only the harness's part (starting the extra replica); the
        # blackhole and the stop run in the background.
        return 3.0, rng.uniform(1.0, 2.0)
    # Slow completions: some shorter than the lease, some longer (heartbeats must
    # keep those leases alive).
    return rng.uniform(6.0, 10.0), rng.uniform(lease * 0.5, lease * 1.5)


# --- servers -------------------------------------------------------------------------


@dataclass
class NatsControl:
    """The harness's own nats-server, which it may kill and restart."""

    server: EmbeddedNats

    def kill(self) -> None:
        proc = self.server.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def start(self) -> None:
        self.server.start()


@dataclass
class PostgresControl:
    """An embedded PostgreSQL (pgserver) the harness may stop and start.

    pgserver runs postgres as the ``pgserver`` user when we are root, so
    pg_ctl runs as that user too; the start options are those pgserver used
    (no TCP, a unix socket in the data folder).
    """

    server: EmbeddedPostgres

    @property
    def pgdata(self) -> Path:
        return self.server.pgdata

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH

        user = "pgserver" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            user=user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        socket_dir = self.pgdata  # where pgserver put the socket (see get_uri)
        self._pg_ctl(
            "-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(self.pgdata / "log"), "start"
        )
        with contextlib.suppress(Exception):
            from pgserver.utils import PostmasterInfo

            # Keep pgserver's handle pointing at the live postmaster, so its own
            # cleanup stops this one.
            self.server.server._postmaster_info = (  # type: ignore[attr-defined]
                PostmasterInfo.read_from_pgdata(self.pgdata)
            )

    def shutdown(self) -> None:
        # pgserver's own cleanup stops the postmaster start() recorded; pg_ctl
        # is the fallback should that handle be stale.
        self.server.stop()
        if (self.pgdata / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.stop()


# --- replicas ------------------------------------------------------------------------


def claimd_command(faults: Faults | None = None) -> list[str]:
    """`claimd`; with faults asked for, the harness's own entry point of broken builds."""
    if faults:
        return broken.command(faults)
    beside = Path(sys.executable).parent / "claimd"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "actors.cli"]


@dataclass
class Replica:
    """One `claimd run` process slot; a slot is restarted when its process dies."""

    name: str
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)  # none: the real `claimd run`
    proc: subprocess.Popen[bytes] | None = None
    down_on_purpose: bool = False  # killed by a fault (restart pending) or retired
    retired: bool = False
    starts: int = 0
    pids: list[int] = field(default_factory=list)  # every process this slot has run

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class UnplannedExit:
    replica: str
    code: int | None
    at: datetime
    last_error: str = ""  # the last error-level log event of the process, if any


@dataclass
class StopRecord:
    """One SIGTERM: how long the process took to exit, and whether it had to be killed."""

    replica: str
    seconds: float
    killed: bool
    during: str = "end of run"


def last_error(log_path: Path, limit: int = 300) -> str:
    """The last error-level JSON log event in a replica's log (or its last line)."""
    last_line = ""
    found = ""
    with contextlib.suppress(OSError), log_path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            last_line = line
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("level") in ("error", "critical"):
                        found = f"{event.get('event')}: {event.get('error', '')}"
    return (found or last_line)[:limit]


class ReplicaSet:
    """The claimd processes: start, kill, pause, and restart the ones that exit.

    The harness plays the container platform: a replica that exits on its own
    (e.g. an actor gave up while PostgreSQL was down) is restarted after a
    second, so that the run goes on; the exit is recorded, with the last error
    its process logged, and fails the run.
    """

    def __init__(
        self,
        config: Path,
        logs: Path,
        env: dict[str, str],
        log_level: str,
        faults: Faults | None = None,
    ) -> None:
        self.config = config
        self.logs = logs
        self.env = env
        self.log_level = log_level
        # The build every slot runs unless told otherwise (a broken build's faults).
        self.faults = faults or Faults()
        self.replicas: dict[str, Replica] = {}
        self.unplanned: list[UnplannedExit] = []
        self.stops: list[StopRecord] = []
        self._watch: asyncio.Task[None] | None = None

    def add(
        self, name: str, extra_env: dict[str, str] | None = None, faults: Faults | None = None
    ) -> Replica:
        """A slot started now, on the set's build unless ``faults`` says otherwise."""
        replica = Replica(
            name, self.logs / f"{name}.log", dict(extra_env or {}), faults or self.faults
        )
        self.replicas[name] = replica
        self.spawn(replica)
        return replica

    def spawn(self, replica: Replica) -> None:
        replica.starts += 1
        with replica.log_path.open("ab") as log:
            log.write(
                f"--- start #{replica.starts} at {datetime.now(UTC).isoformat()} "
                f"env {replica.extra_env} faults {replica.faults.args()}\n".encode()
            )
        log = replica.log_path.open("ab")  # handed to the child
        try:
            replica.proc = subprocess.Popen(
                [
                    *claimd_command(replica.faults),
                    "--log-level",
                    self.log_level,
                    "run",
                    "--config",
                    str(self.config),
                ],
                env={**self.env, **replica.extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        finally:
            log.close()
        replica.pids.append(replica.proc.pid)
        replica.down_on_purpose = False

    def pid(self, name: str) -> int | None:
        replica = self.replicas[name]
        return replica.proc.pid if replica.alive and replica.proc is not None else None

    def signal(self, name: str, sig: signal.Signals) -> bool:
        replica = self.replicas[name]
        if not replica.alive or replica.proc is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(replica.proc.pid, sig)
        return True

    def kill(self, name: str) -> bool:
        replica = self.replicas[name]
        replica.down_on_purpose = True
        if not self.signal(name, signal.SIGKILL):
            return False
        assert replica.proc is not None
        replica.proc.wait()
        return True

    async def retire(
        self, name: str, timeout: float = 40.0, during: str = "end of run"
    ) -> StopRecord | None:
        """SIGTERM (graceful stop), timed; SIGKILL if it outlives ``timeout``."""
        replica = self.replicas[name]
        replica.down_on_purpose = replica.retired = True
        if replica.proc is None or replica.proc.poll() is not None:
            return None
        signalled = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(replica.proc.pid, signal.SIGCONT)
            os.kill(replica.proc.pid, signal.SIGTERM)
        deadline = signalled + timeout
        while replica.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        killed = replica.proc.poll() is None
        if killed:
            replica.proc.kill()
            replica.proc.wait()
        record = StopRecord(name, time.monotonic() - signalled, killed, during)
        self.stops.append(record)
        return record

    def start_watching(self) -> None:
        self._watch = asyncio.create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for replica in list(self.replicas.values()):
                if replica.down_on_purpose or replica.proc is None:
                    continue
                code = replica.proc.poll()
                if code is None:
                    continue
                self.unplanned.append(
                    UnplannedExit(
                        replica.name, code, datetime.now(UTC), last_error(replica.log_path)
                    )
                )
                replica.down_on_purpose = True  # until respawned below
                asyncio.get_running_loop().call_later(1.0, self._respawn, replica)

    def _respawn(self, replica: Replica) -> None:
        if not replica.retired and not replica.alive:
            self.spawn(replica)

    async def stop_all(self, timeout: float = 40.0) -> None:
        """SIGTERM every replica still running, at once; each stop is timed."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await asyncio.gather(
            *(self.retire(name, timeout) for name, r in self.replicas.items() if not r.retired)
        )

    def kill_all(self) -> None:
        """Last-resort cleanup: nothing the harness started may outlive it."""
        for replica in self.replicas.values():
            replica.retired = replica.down_on_purpose = True
            if replica.proc is not None and replica.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
                replica.proc.kill()
                replica.proc.wait()

"""The real `claimd` command, end to end, in subprocesses against the test servers.

Each test runs the console script as an operator would (config file, signals,
exit codes, JSON logs on stderr) and judges it by the database rows and by the
side effects its jobs leave in a file: every due second one succeeded row,
every run executed once, a clean exit on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from actors.adapters.embedded import free_port
from actors.adapters.postgres import migration_files
from tests.e2e.helpers import (
    ClaimdProcess,
    JobFigures,
    check_effectively_once,
    effect_job,
    eventually,
    http_port_of,
    metric_total,
    port_is_free,
    port_is_open,
    read_effects,
    scrape_metrics,
    utcnow,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

RUN_WINDOW_S = 10.0  # how long the replicas run once the first effect appears
GRACE_S = 10  # shutdown_grace in the configs
EXIT_MARGIN_S = 15.0  # time allowed past the grace for the process to exit
SHIPPED_HTTP_PORT = 8780  # config/jobs.toml


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., ClaimdProcess]]:
    """Start `claimd` subprocesses; whatever is still running at teardown is killed."""
    started: list[ClaimdProcess] = []

    def start(*args: str, label: str | None = None) -> ClaimdProcess:
        process = ClaimdProcess(list(args), tmp_path, label or f"claimd{len(started)}")
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.kill()


def run_config(
    path: Path, schema_url: str, nats_url: str, deployment: str, jobs: str, **extra: str | int
) -> Path:
    settings: dict[str, str | int] = {
        "database_url": schema_url,
        "nats_url": nats_url,
        "deployment": deployment,
        "http": "127.0.0.1:0",
        "shutdown_grace": f"{GRACE_S}s",
        "claim_interval": "100ms",
        "materialize_interval": "500ms",
        # The config watch off: these tests' verdicts are SIGHUP's (`claimd reload`
        # after an edit), which a watch reloading first would leave with nothing
        # to change. tests/e2e/test_rollout.py turns it on.
        "config_poll": "0s",
        **extra,
    }
    return write_config(path, jobs=jobs, **settings)


async def fetchval(schema_url: str, sql: str, *args: object) -> object:
    conn = await asyncpg.connect(schema_url)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def succeeded_runs(schema_url: str, job: str) -> int:
    try:
        value = await fetchval(
            schema_url,
            "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = $1 AND r.state = 'succeeded'",
            job,
        )
    except asyncpg.UndefinedTableError:  # not migrated yet
        return 0
    except asyncpg.DeadlockDetectedError:
        # Migrating now: this read locked one table while the replica's
        # migration, holding another exclusively, waited for it (CI saw it once).
        return 0
    return int(value)  # type: ignore[call-overload]


async def run_window(
    processes: list[ClaimdProcess], effects: Path
) -> tuple[float, dict[str, float]]:
    """Wait for the first effect, let the replicas run RUN_WINDOW_S, scrape metrics,
    SIGTERM them all; assert each exits 0 within the grace. Returns the seconds from
    the first effect's scheduled instant to the SIGTERM, and the summed metrics."""

    async def started() -> bool:
        for p in processes:
            assert p.returncode() is None, f"{p.label} exited early:\n{p.stderr()[-3000:]}"
        return bool(read_effects(effects))

    await eventually(started, timeout=45, what="the first execution")
    first = min(e.scheduled_at for e in read_effects(effects))
    deadline = time.monotonic() + RUN_WINDOW_S
    while time.monotonic() < deadline:  # a run length, not an ordering: the DB is judged after
        for p in processes:
            assert p.returncode() is None, f"{p.label} exited early:\n{p.stderr()[-3000:]}"
        await asyncio.sleep(0.2)
    metrics: dict[str, float] = {}
    for p in processes:
        port = http_port_of(p)
        assert port is not None, "the replica did not log its HTTP port"
        for name, value in (await asyncio.to_thread(scrape_metrics, port)).items():
            metrics[name] = metrics.get(name, 0.0) + value
    for p in processes:
        p.terminate()
    stopped_at = utcnow()
    for p in processes:
        code = await p.wait(GRACE_S + EXIT_MARGIN_S)
        assert code == 0, f"{p.label} exited {code}:\n{p.stderr()[-3000:]}"
        assert p.events("replica stopped"), "no 'replica stopped' log line"
    return (stopped_at - first).total_seconds(), metrics


def report(
    title: str, figures: list[JobFigures], elapsed: float, metrics: dict[str, float]
) -> None:
    runs = sum(f.succeeded for f in figures)
    dups = sum(f.duplicate_executions for f in figures)
    print(
        f"\n[e2e figures] {title}: {runs} runs recorded over {elapsed:.1f}s since the "
        f"first due instant = {runs / elapsed:.2f} runs/s "
        f"({len(figures)} job(s) every 1s; per job "
        + ", ".join(f"{f.job}={f.runs_per_second:.2f}/s" for f in figures)
        + f"); duplicate executions (effects file) = {dups}; "
        f"redeliveries = {metric_total(metrics, 'claimd_redeliveries_total'):.0f}; "
        f"deliveries skipped = {metric_total(metrics, 'claimd_deliveries_skipped_total'):.0f}; "
        f"fenced completions = "
        f"{metric_total(metrics, 'claimd_fenced_completions_total'):.0f}"
    )


# --- 1. one replica -----------------------------------------------------------------------


async def test_run_records_each_due_second_once_and_stops_on_sigterm(
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    effects = tmp_path / "effects.txt"
    config = run_config(
        tmp_path / "claimd.toml", schema_url, nats_url, deployment, effect_job("tick", effects)
    )
    replica = spawn("run", "--config", str(config))

    elapsed, metrics = await run_window([replica], effects)

    figures = await check_effectively_once(schema_url, "tick", read_effects(effects))
    report("1 replica", [figures], elapsed, metrics)
    assert figures.succeeded >= elapsed - 3, (
        f"{figures.succeeded} runs in {elapsed:.1f}s: the replica fell behind"
    )
    assert list(figures.workers) == [w for w in figures.workers if f":{replica.pid}:" in w]
    assert figures.workers, "no attempt recorded a worker"


# --- 2. two replicas share the work -------------------------------------------------------


async def test_two_replicas_share_the_work_without_doubles(
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    effects = tmp_path / "effects.txt"
    jobs = "".join(effect_job(f"tick{i}", effects) for i in range(3))
    config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
    replicas = [spawn("run", "--config", str(config), label=f"replica{i}") for i in range(2)]

    elapsed, metrics = await run_window(replicas, effects)

    all_effects = read_effects(effects)
    figures = [await check_effectively_once(schema_url, f"tick{i}", all_effects) for i in range(3)]
    report("2 replicas", figures, elapsed, metrics)
    for f in figures:
        assert f.succeeded >= elapsed - 3, f"{f.job}: {f.succeeded} runs in {elapsed:.1f}s"
    per_replica = {r.pid: 0 for r in replicas}
    for f in figures:
        for worker, count in f.workers.items():
            pid = int(worker.split(":")[1])
            assert pid in per_replica, f"a worker that is not ours: {worker}"
            per_replica[pid] += count
    print(f"[e2e figures] 2 replicas: runs executed per replica {sorted(per_replica.values())}")
    assert all(count > 0 for count in per_replica.values()), (
        f"one replica executed nothing: {per_replica}"
    )


# --- 3. bad config through the entry point ------------------------------------------------


async def test_check_config_names_the_file_job_and_field_of_a_bad_job(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    path = write_config(
        tmp_path / "bad.toml",
        jobs="""
[jobs.fine]
every = "1m"
run = { shell = ["/bin/true"] }

[jobs.broken-one]
every = "1 fortnight"
run = { shell = ["/bin/true"] }
""",
    )
    checker = spawn("check-config", str(path))
    assert await checker.wait(30) != 0
    errors = [line for line in checker.stderr().splitlines() if line.startswith("error:")]
    assert len(errors) == 1, checker.stderr()
    assert str(path) in errors[0]
    assert "'broken-one'" in errors[0]
    assert "field 'every'" in errors[0]
    assert "fine: every" in checker.stdout(), "the valid job was not listed"


async def test_check_config_prints_dst_correct_fire_times(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    path = write_config(
        tmp_path / "good.toml",
        jobs="""
[jobs.berlin]
cron = "30 2 * * *"
timezone = "Europe/Berlin"
run = { shell = ["/bin/true"] }
""",
    )
    checker = spawn(
        "check-config", str(path), "--from", "2026-03-28T00:00:00+00:00", "--count", "3"
    )
    assert await checker.wait(30) == 0, checker.stderr()
    fire_lines = [line for line in checker.stdout().splitlines() if line.startswith("  ")]
    lines = [line.split()[:2] for line in fire_lines]
    # 2026-03-29 02:30 does not exist in Berlin (clocks jump 02:00 -> 03:00): it fires at 03:00,
    # and check-config says which rule put it there.
    assert fire_lines[1].endswith(
        "[dst gap, offset +02:00: dst.gap = shift: runs at the end of the gap]"
    )
    assert lines == [
        ["2026-03-28T01:30:00+00:00", "2026-03-28T02:30:00+01:00"],
        ["2026-03-29T01:00:00+00:00", "2026-03-29T03:00:00+02:00"],
        ["2026-03-30T00:30:00+00:00", "2026-03-30T02:30:00+02:00"],
    ], checker.stdout()


async def test_run_keeps_running_the_good_job_when_another_is_invalid(
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    effects = tmp_path / "effects.txt"
    jobs = effect_job("good", effects) + effect_job("bad", effects, every="1 fortnight")
    config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
    replica = spawn("run", "--config", str(config))

    async def good_ran_twice() -> bool:
        assert replica.returncode() is None, f"exited early:\n{replica.stderr()[-3000:]}"
        return await succeeded_runs(schema_url, "good") >= 2

    await eventually(good_ran_twice, timeout=45, what="two succeeded runs of the good job")
    skipped = replica.events("invalid job skipped; the others run")
    assert [(e["job"], e["field"], e["level"]) for e in skipped] == [("bad", "every", "error")]
    assert skipped[0]["path"] == str(config)
    assert await fetchval(schema_url, "SELECT count(*) FROM jobs WHERE name = 'bad'") == 0
    assert {e.job for e in read_effects(effects)} == {"good"}
    replica.terminate()
    assert await replica.wait(GRACE_S + EXIT_MARGIN_S) == 0, replica.stderr()[-3000:]


# --- 4. migrate ---------------------------------------------------------------------------


async def migration_rows(schema_url: str) -> list[int]:
    conn = await asyncpg.connect(schema_url)
    try:
        return [
            r["version"]
            for r in await conn.fetch("SELECT version FROM claimd_migrations ORDER BY version")
        ]
    finally:
        await conn.close()


async def test_migrate_applies_each_migration_once_when_run_twice(
    schema_url: str, spawn: Callable[..., ClaimdProcess]
) -> None:
    versions = [v for v, _ in migration_files()]
    first = spawn("migrate", "--database-url", schema_url, label="migrate1")
    assert await first.wait(60) == 0, first.stderr()
    names = [p.name for _, p in migration_files()]
    assert first.stdout().strip() == "applied: " + ", ".join(names)
    assert await migration_rows(schema_url) == versions

    second = spawn("migrate", "--database-url", schema_url, label="migrate2")
    assert await second.wait(60) == 0, second.stderr()
    assert second.stdout().strip() == "applied: nothing (up to date)"
    assert await migration_rows(schema_url) == versions
    assert await fetchval(schema_url, "SELECT count(*) FROM job_runs") == 0


async def test_two_concurrent_migrates_apply_each_migration_once(
    schema_url: str, spawn: Callable[..., ClaimdProcess]
) -> None:
    versions = [v for v, _ in migration_files()]
    names = [p.name for _, p in migration_files()]
    racers = [spawn("migrate", "--database-url", schema_url, label=f"migrate{i}") for i in range(2)]
    for racer in racers:
        assert await racer.wait(60) == 0, racer.stderr()
    outputs = sorted(r.stdout().strip() for r in racers)
    # The advisory lock serialises them: one applies everything, the other finds it done.
    assert outputs == sorted(["applied: " + ", ".join(names), "applied: nothing (up to date)"])
    assert await migration_rows(schema_url) == versions


# --- 5. claimd dev: embedded PostgreSQL and nats-server -----------------------------------


def short_data_dir() -> Path:
    # A Unix socket path is limited to ~107 bytes; pgserver puts its socket in the data dir.
    return Path(tempfile.mkdtemp(prefix="claimd-e2e-"))


def stop_embedded_postgres(data_dir: Path) -> None:
    """Teardown: end a postmaster the dev process left behind (by its pid file); remove the data."""
    pid_file = data_dir / "pg" / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
        if postmaster.name() == "postgres":
            postmaster.send_signal(signal.SIGINT)  # fast shutdown
            postmaster.wait(15)
    shutil.rmtree(data_dir, ignore_errors=True)


async def dev_session(
    spawn: Callable[..., ClaimdProcess],
    data_dir: Path,
    nats_port: int,
    *config: str,
    while_running: Callable[[], Awaitable[None]] | None = None,
) -> ClaimdProcess:
    """Start `claimd dev`, wait for succeeded runs, SIGTERM, check it cleaned up."""
    dev = spawn(
        "dev", "--data-dir", str(data_dir), "--nats-port", str(nats_port), *config, label="dev"
    )

    async def ran() -> bool:
        if dev.returncode() is not None:
            return True  # judged below
        dev.remember_descendants()
        done = [e for e in dev.events("run finished") if e.get("outcome") == "succeeded"]
        return len(done) >= 2

    await eventually(ran, timeout=60, what="'run finished' succeeded log lines from claimd dev")
    if dev.returncode() is not None and " in use" in dev.stderr():  # "already in use", "is in use"
        pytest.skip("a port claimd dev needs was taken by another process")
    assert dev.returncode() is None, f"claimd dev exited early:\n{dev.stderr()[-3000:]}"
    assert port_is_open(nats_port), "the embedded nats-server is not listening"
    assert (data_dir / "pg" / "postmaster.pid").exists(), "no embedded PostgreSQL"
    if while_running is not None:
        await while_running()
    dev.terminate()
    assert await dev.wait(GRACE_S + 30 + EXIT_MARGIN_S) == 0, dev.stderr()[-3000:]

    async def servers_stopped() -> bool:
        return not port_is_open(nats_port) and not (data_dir / "pg" / "postmaster.pid").exists()

    await eventually(
        servers_stopped, timeout=15, what="the embedded nats-server and PostgreSQL to stop"
    )
    return dev


async def test_dev_runs_jobs_on_embedded_servers_and_stops_them(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    effects = tmp_path / "effects.txt"
    config = write_config(
        tmp_path / "dev.toml",
        http="127.0.0.1:0",
        claim_interval="100ms",
        materialize_interval="500ms",
        jobs=effect_job("tick", effects),
    )
    data_dir = short_data_dir()
    try:
        dev = await dev_session(spawn, data_dir, free_port(), "--config", str(config))
        server_log = (data_dir / "servers.log").read_text()
    finally:
        stop_embedded_postgres(data_dir)
    finished = [e for e in dev.events("run finished") if e["outcome"] == "succeeded"]
    assert {e["job"] for e in finished} == {"tick"}
    assert {e["run_id"] for e in finished} <= {e.run_id for e in read_effects(effects)}
    # The database is the embedded one in the data folder, not the machine's server.
    assert f"host={data_dir}/pg" in dev.stderr()
    # The embedded servers' set-up chatter is in a file of the data folder; stderr has
    # the banner (its URLs, the data folder, how to stop) and the JSON log lines.
    assert "initdb" in server_log
    assert not [e for e in dev.logs() if e.get("logger") == "pgserver"]
    other = [line for line in dev.stderr().splitlines() if not line.startswith("{")]
    assert other[0] == "claimd dev is starting"
    assert any(line.startswith("  status page  http://127.0.0.1:") for line in other)
    assert any(line.startswith("  reads        open to whoever reaches") for line in other)
    assert f"  data         {data_dir}  (server logs: {data_dir / 'servers.log'}" in "\n".join(
        other
    )
    assert any(line.startswith("  stop         Ctrl-C") for line in other)
    assert len(other) <= 11, other


def _nats_servers_on(store: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "nats-server" in line and str(store) in line:
            found.append(proc.pid)
    return found


async def test_dev_sigkilled_leaves_nothing_the_next_start_does_not_stop(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    """A SIGKILLed `claimd dev` (no cleanup code runs) leaves its nats-server and
    PostgreSQL; the next start on the same folder must find them: never two
    nats-servers on one store, and its own stop ends every server. A second
    `claimd dev` on a folder a live one holds is refused."""
    effects = tmp_path / "effects.txt"
    config = write_config(
        tmp_path / "dev.toml",
        http="127.0.0.1:0",
        claim_interval="100ms",
        materialize_interval="500ms",
        jobs=effect_job("tick", effects),
    )
    data_dir = short_data_dir()
    store = data_dir / "nats"
    try:
        first = spawn("dev", "--data-dir", str(data_dir), "--config", str(config), label="dev1")

        async def first_ran() -> bool:
            if first.returncode() is not None:
                return True
            first.remember_descendants()
            return any(e.get("outcome") == "succeeded" for e in first.events("run finished"))

        await eventually(first_ran, timeout=60, what="a succeeded run under the first claimd dev")
        assert first.returncode() is None, first.stderr()[-3000:]
        first.proc.kill()  # type: ignore[union-attr]  # SIGKILL: no cleanup code runs
        await first.wait(10)

        async def refused_while_held() -> None:
            other = spawn("dev", "--data-dir", str(data_dir), "--config", str(config), label="d3")
            assert await other.wait(30) == 2, other.stderr()[-2000:]
            assert "another claimd dev (pid " in other.stderr()
            assert len(_nats_servers_on(store)) == 1, "two nats-servers on one store"

        await dev_session(
            spawn,
            data_dir,
            free_port(),
            "--config",
            str(config),
            while_running=refused_while_held,
        )

        async def none_left() -> bool:
            return not _nats_servers_on(store)

        await eventually(none_left, timeout=15, what="no nats-server left on the store")
    finally:
        stop_embedded_postgres(data_dir)


async def test_dev_without_config_runs_the_shipped_jobs(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    # The shipped config/jobs.toml serves HTTP on 127.0.0.1:8780 and nothing on the
    # command line overrides it; when another process holds the port, skip.
    if not port_is_free(SHIPPED_HTTP_PORT):
        pytest.skip(f"port {SHIPPED_HTTP_PORT} (config/jobs.toml http) is taken")
    health: list[int] = []

    async def healthz() -> None:
        url = f"http://127.0.0.1:{SHIPPED_HTTP_PORT}/healthz"
        response = await asyncio.to_thread(urllib.request.urlopen, url, timeout=5)
        with response:
            health.append(response.status)

    data_dir = short_data_dir()
    try:
        dev = await dev_session(spawn, data_dir, free_port(), while_running=healthz)
    finally:
        stop_embedded_postgres(data_dir)
    finished = [e for e in dev.events("run finished") if e["outcome"] == "succeeded"]
    assert "beat" in {e["job"] for e in finished}
    started = dev.events("replica started")
    assert [(e["http"], e["jobs"]) for e in started] == [(f"127.0.0.1:{SHIPPED_HTTP_PORT}", 3)]
    assert health == [200]
    # A stop is quiet: the python fork server ends with the worker, not noticed gone
    # when the loop is torn down ("python fork server ended", asyncio's closed-loop
    # warning about its pid), which a newcomer saw at every Ctrl-C.
    stopping = dev.stderr().partition("stopping")[2]
    assert "fork server ended" not in stopping, stopping[-2000:]
    assert "is closed" not in stopping, stopping[-2000:]

"""What an operator sees of a real `claimd run`: exact metrics, truthful health, structured logs.

- After a known sequence (successes, a final failure, a redelivered terminal
  run, a reaped run, a backfill) every series on /metrics has its exact value,
  the start-lag histogram holds the scheduled runs only (not the backfill) and
  the last-success gauge is the database's time of the last success.
- HTTP answers before the servers do (PostgreSQL unreachable at start: /healthz
  and /metrics answer, the replica waits and starts once it is reachable);
  /readyz fails within seconds of a frozen nats-server, or a frozen database,
  while /healthz and /metrics answer.
- A run's final failure is one JSON line at error level with its error; a NATS
  outage under a running replica produces JSON lines only.

Before this change: the per-job label was `job` (a scrape renames it
`exported_job`), there was no last-success gauge, the lag histogram took the
backfill (its sum years), HTTP started after both servers connected, /readyz
stayed 200 with NATS frozen, and a final failure was an info line without its
error: each test below fails on that build.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import pytest

from actors.adapters.embedded import free_port
from actors.adapters.nats import encode
from actors.observability import claimd_version
from actors.ports import DispatchMessage
from tests.e2e.helpers import ClaimdProcess, child_env, claimd_command, eventually, write_config
from tests.e2e.observe_helpers import (
    PrivateNats,
    http_get,
    json_lines,
    parse_metrics,
    private_nats,
    sample,
    spawn,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
__all__ = ["private_nats", "spawn"]  # fixtures

RARE_CRON = "0 0 1 1 *"  # nothing materialized inside a test: the test inserts the runs
JOBS = f"""
[jobs.ok]
cron = "{RARE_CRON}"
max_attempts = 2
run = {{ shell = ["true"] }}

[jobs.bad]
cron = "{RARE_CRON}"
max_attempts = 1
run = {{ shell = ["sh", "-c", "echo it broke >&2; exit 3"] }}
"""
FAST = {
    "claim_interval": "100ms",
    "materialize_interval": "500ms",
    "reap_interval": "200ms",
    "shutdown_grace": "5s",
}


def config(
    tmp_path: Path,
    database_url: str,
    nats_url: str,
    deployment: str,
    port: int,
    jobs: str = JOBS,
    **settings: str | int,
) -> Path:
    return write_config(
        tmp_path / "claimd.toml",
        jobs=jobs,
        database_url=database_url,
        nats_url=nats_url,
        deployment=deployment,
        http=f"127.0.0.1:{port}",
        **(FAST | settings),
    )


async def metrics(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, text = await http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return parse_metrics(text)


async def insert_scheduled(conn: asyncpg.Connection, job: str, count: int) -> list[str]:
    """``count`` scheduled runs of ``job`` due now (trigger 'schedule', the default)."""
    rows = await conn.fetch(
        """INSERT INTO job_runs (job_id, scheduled_at, due_at)
           SELECT j.id, now() - g * interval '1 ms', now() - g * interval '1 ms'
             FROM jobs j, generate_series(1, $2::int) AS g WHERE j.name = $1
           RETURNING id::text""",
        job,
        count,
    )
    return [r["id"] for r in rows]


async def started(replica: ClaimdProcess) -> None:
    """Wait for the replica's 'replica started' line (migrated, connected, serving)."""

    async def up() -> bool:
        return bool(replica.events("replica started"))

    await eventually(up, timeout=30, what="the replica to start")


async def states(conn: asyncpg.Connection, job: str) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT r.state, count(*) AS n FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = $1 GROUP BY r.state",
        job,
    )
    return {r["state"]: r["n"] for r in rows}


async def test_metrics_after_a_known_sequence_are_exact(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    port = free_port()
    replica = spawn(
        "--log-level",
        "INFO",
        "run",
        "--config",
        str(config(tmp_path, schema_url, nats_url, deployment, port)),
        label="replica",
    )
    conn = await asyncpg.connect(schema_url)
    nc = await nats.connect(nats_url)
    try:
        await started(replica)

        # Every series exists from the start, at zero, for every job of the config.
        first = await metrics(port)
        for job in ("ok", "bad"):
            for outcome in ("succeeded", "failed", "timed_out"):
                assert (
                    sample(first, "claimd_runs_completed_total", claimd_job=job, outcome=outcome)
                    == 0
                )
            assert sample(first, "claimd_runs_started_total", claimd_job=job) == 0
            assert sample(first, "claimd_runs_failed_total", claimd_job=job) == 0
            assert sample(first, "claimd_runs_missed_total", claimd_job=job) == 0
            assert sample(first, "claimd_start_lag_seconds_count", claimd_job=job) == 0
            assert sample(first, "claimd_job_overdue_runs", claimd_job=job) == 0
        assert sample(first, "claimd_deliveries_skipped_total", reason="terminal") == 0
        assert sample(first, "claimd_runs_reaped_total", transition="running->pending") == 0
        assert sample(first, "claimd_actor_restarts_total", actor="worker") == 0
        assert not any(labels and dict(labels).get("job") for _, labels in first), (
            "a series carries a `job` label: Prometheus would rename it exported_job"
        )

        # 1. Three scheduled successes.
        await insert_scheduled(conn, "ok", 3)

        async def ok_succeeded(n: int) -> bool:
            return (await states(conn, "ok")).get("succeeded", 0) == n

        await eventually(lambda: ok_succeeded(3), timeout=30, what="3 successes")

        # 2. A final failure.
        await insert_scheduled(conn, "bad", 1)

        async def bad_failed() -> bool:
            return (await states(conn, "bad")).get("failed", 0) == 1

        await eventually(bad_failed, timeout=30, what="the failure")

        # 3. A terminal run delivered again (a new message with the same run and epoch).
        row = await conn.fetchrow(
            "SELECT r.id::text AS id, r.claim_epoch, r.scheduled_at, r.attempt FROM job_runs r "
            "JOIN jobs j ON j.id = r.job_id WHERE j.name = 'ok' AND r.state = 'succeeded' "
            "LIMIT 1"
        )
        assert row is not None
        again = DispatchMessage(
            run_id=row["id"],
            epoch=row["claim_epoch"],
            job="ok",
            scheduled_at=row["scheduled_at"],
            attempt=row["attempt"],
            deployment=deployment,
        )
        await nc.jetstream().publish(f"claimd.{deployment}.runs", encode(again))

        async def skipped_terminal() -> bool:
            return (
                sample(await metrics(port), "claimd_deliveries_skipped_total", reason="terminal")
                == 1
            )

        await eventually(skipped_terminal, timeout=30, what="the terminal delivery skipped")

        # 4. A run whose worker vanished: running under a lease that has expired.
        await conn.execute(
            """INSERT INTO job_runs (job_id, scheduled_at, due_at, state, attempt, claim_epoch,
                                     lease_owner, lease_expires_at, claimed_at, started_at)
               SELECT id, now() - interval '3 s', now() - interval '3 s', 'running', 1, 1,
                      'ghost', now() - interval '1 s', now() - interval '3 s',
                      now() - interval '2 s'
                 FROM jobs WHERE name = 'ok'"""
        )
        await eventually(lambda: ok_succeeded(4), timeout=30, what="the reaped run to rerun")

        # 5. A backfill of three past instants (1 January 2020, 2021, 2022).
        backfill = await asyncio.to_thread(
            subprocess.run,
            [
                *claimd_command(),
                "backfill",
                "ok",
                "--from",
                "2020-01-01T00:00:00+00:00",
                "--to",
                "2022-01-01T00:00:00+00:00",
                "--database-url",
                schema_url,
            ],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
            check=False,
        )
        assert backfill.returncode == 0, backfill.stderr
        await eventually(lambda: ok_succeeded(7), timeout=30, what="the backfilled runs")

        last = await conn.fetchrow(
            """SELECT max(finished_at) FILTER (WHERE state = 'succeeded' AND j.name = 'ok')
                          AS ok_success,
                      max(finished_at) FILTER (WHERE state = 'failed' AND j.name = 'bad')
                          AS bad_failure,
                      sum(extract(epoch FROM started_at - due_at))
                          FILTER (WHERE j.name = 'ok' AND trigger = 'schedule')::float8
                          AS ok_lag_sum
                 FROM job_runs r JOIN jobs j ON j.id = r.job_id"""
        )
        assert last is not None
        sql_lag = last["ok_lag_sum"]
        scraped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}

        async def settled() -> bool:
            # Counters move when the worker acks; the cluster gauges are read from
            # the database at most once a second: wait for a scrape that has both.
            scraped.clear()
            scraped.update(await metrics(port))
            return (
                sample(scraped, "claimd_runs_completed_total", claimd_job="ok", outcome="succeeded")
                == 7
                and sample(scraped, "claimd_job_last_success_timestamp_seconds", claimd_job="ok")
                == last["ok_success"].timestamp()
            )

        await eventually(settled, timeout=30, what="the counters and gauges to settle")
        got = dict(scraped)
    finally:
        await nc.close()
        await conn.close()

    expected = {
        ("claimd_runs_started_total", (("claimd_job", "ok"),)): 7,  # 3 + reaped rerun + 3
        ("claimd_runs_started_total", (("claimd_job", "bad"),)): 1,
        ("claimd_runs_completed_total", (("claimd_job", "ok"), ("outcome", "succeeded"))): 7,
        ("claimd_runs_completed_total", (("claimd_job", "ok"), ("outcome", "failed"))): 0,
        ("claimd_runs_completed_total", (("claimd_job", "bad"), ("outcome", "failed"))): 1,
        ("claimd_runs_completed_total", (("claimd_job", "bad"), ("outcome", "succeeded"))): 0,
        ("claimd_runs_failed_total", (("claimd_job", "bad"),)): 1,
        ("claimd_runs_failed_total", (("claimd_job", "ok"),)): 0,
        ("claimd_runs_claimed_total", ()): 8,
        ("claimd_dispatch_published_total", ()): 8,
        ("claimd_dispatch_publish_failed_total", ()): 0,
        ("claimd_deliveries_skipped_total", (("reason", "terminal"),)): 1,
        ("claimd_redeliveries_total", ()): 0,  # the second delivery was a new message
        ("claimd_runs_reaped_total", (("transition", "running->pending"),)): 1,
        ("claimd_runs_reaped_total", (("transition", "running->failed"),)): 0,
        ("claimd_runs_reaped_total", (("transition", "claimed->pending"),)): 0,
        ("claimd_fenced_completions_total", ()): 0,
        ("claimd_runs_missed_total", (("claimd_job", "ok"),)): 0,
        ("claimd_runs_materialized_total", ()): 0,
        # Lag: the 3 scheduled runs and the reaped one's rerun; not the 3 backfilled.
        ("claimd_start_lag_seconds_count", (("claimd_job", "ok"),)): 4,
        ("claimd_start_lag_seconds_bucket", (("claimd_job", "ok"), ("le", "+Inf"))): 4,
        ("claimd_start_lag_seconds_count", (("claimd_job", "bad"),)): 1,
        ("claimd_run_duration_seconds_count", (("claimd_job", "ok"),)): 7,
        ("claimd_worker_runs_in_flight", ()): 0,
        # Cluster-wide, from the database.
        ("claimd_job_overdue_runs", (("claimd_job", "ok"),)): 0,
        ("claimd_overdue_runs", ()): 0,
        ("claimd_overdue_oldest_age_seconds", ()): 0,
        ("claimd_runs_in_flight", (("state", "claimed"),)): 0,
        ("claimd_runs_in_flight", (("state", "running"),)): 0,
        ("claimd_runs_past_lease", ()): 0,
        ("claimd_job_paused", (("claimd_job", "ok"),)): 0,
        ("claimd_dependency_up", (("dependency", "postgres"),)): 1,
        ("claimd_dependency_up", (("dependency", "nats"),)): 1,
        ("claimd_reconnects_total", (("dependency", "postgres"),)): 0,
        ("claimd_reconnects_total", (("dependency", "nats"),)): 0,
        ("claimd_build_info", (("python", _python()), ("version", claimd_version()))): 1,
    }
    actual = {key: sample(got, key[0], **dict(key[1])) for key in expected}
    assert actual == expected

    # The last success is the database's finished_at of the last succeeded run.
    assert (
        sample(got, "claimd_job_last_success_timestamp_seconds", claimd_job="ok")
        == last["ok_success"].timestamp()
    )
    assert sample(
        got, "claimd_job_last_failure_timestamp_seconds", claimd_job="bad"
    ) == pytest.approx(last["bad_failure"].timestamp(), abs=1e-6)
    assert sample(got, "claimd_job_last_success_timestamp_seconds", claimd_job="bad") is None
    # Lag: the scheduled runs' own (started_at - due_at), seconds; a backfilled
    # instant of 2020 would have added about 2e8.
    lag_sum = sample(got, "claimd_start_lag_seconds_sum", claimd_job="ok")
    assert lag_sum is not None
    assert abs(lag_sum - sql_lag) < 1.0, (lag_sum, sql_lag)
    # The yearly schedule's period: its longest gap, a leap year.
    assert sample(got, "claimd_job_period_seconds", claimd_job="ok") == 366 * 86400


def _python() -> str:
    return ".".join(str(n) for n in sys.version_info[:3])


async def test_readyz_fails_within_seconds_of_a_frozen_nats_and_healthz_stays_up(
    tmp_path: Path,
    schema_url: str,
    deployment: str,
    private_nats: PrivateNats,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    port = free_port()
    spawn(
        "run",
        "--config",
        str(config(tmp_path, schema_url, private_nats.url, deployment, port)),
        label="replica",
    )
    base = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        return (await http_get(f"{base}/readyz"))[0] == 200

    await eventually(ready, timeout=30, what="/readyz 200")

    private_nats.freeze()  # SIGSTOP: the TCP connection stays open, nothing answers
    try:
        frozen_at = time.monotonic()

        async def unready() -> bool:
            return (await http_get(f"{base}/readyz"))[0] == 503

        # The deadline of the NATS round trip in /readyz is 2 s; allow for a loaded machine.
        await eventually(unready, timeout=15, what="/readyz 503 with NATS frozen")
        noticed_s = time.monotonic() - frozen_at
        status, body = await http_get(f"{base}/readyz")
        checks = json.loads(body)["checks"]
        assert status == 503
        assert checks["postgres"] == "ok", checks
        assert checks["nats"] != "ok", checks
        assert (await http_get(f"{base}/healthz"))[0] == 200
        frozen = await metrics(port)  # its round trip to NATS fails too: the gauge says so
        assert sample(frozen, "claimd_dependency_up", dependency="nats") == 0
        assert sample(frozen, "claimd_dependency_up", dependency="postgres") == 1
        print(f"\n[readyz] 503 {noticed_s:.1f}s after SIGSTOP of nats-server: {checks['nats']}")
    finally:
        private_nats.thaw()
    await eventually(ready, timeout=30, what="/readyz 200 again after SIGCONT")

    async def up_again() -> bool:  # a /metrics page is rendered at most once a second
        return sample(await metrics(port), "claimd_dependency_up", dependency="nats") == 1

    await eventually(up_again, timeout=10, what="/metrics to say NATS is up again")
    thawed = await metrics(port)
    assert sample(thawed, "claimd_dependency_up", dependency="nats") == 1
    assert sample(thawed, "claimd_reconnects_total", dependency="nats") == 1


async def test_http_answers_while_postgres_is_unreachable_at_start_then_the_replica_starts(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    closed = free_port()  # nothing listens there, until the forwarder below does
    port = free_port()
    real = urlsplit(schema_url)
    if real.hostname is None:
        # The embedded server (no CLAIMD_TEST_DATABASE_URL) listens on a Unix
        # socket; this test forwards a TCP port to the database.
        pytest.skip("needs a TCP database URL (set CLAIMD_TEST_DATABASE_URL)")
    unreachable = urlunsplit(real._replace(netloc=f"postgres:hunter2@127.0.0.1:{closed}"))
    replica = spawn(
        "run",
        "--config",
        str(config(tmp_path, unreachable, nats_url, deployment, port)),
        label="replica",
    )
    base = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        return (await http_get(f"{base}/healthz", timeout=2))[0] == 200

    await eventually(healthy, timeout=30, what="/healthz with PostgreSQL unreachable")
    status, text = await http_get(f"{base}/metrics")
    assert status == 200
    samples = parse_metrics(text)
    assert sample(samples, "claimd_runs_started_total", claimd_job="ok") == 0
    assert sample(samples, "claimd_cluster_metrics_age_seconds") == float("inf")
    assert sample(samples, "claimd_dependency_up", dependency="postgres") == 0
    assert sample(samples, "claimd_dependency_up", dependency="nats") == 0
    status, body = await http_get(f"{base}/readyz")
    assert status == 503
    assert json.loads(body)["checks"] == {"postgres": "not connected", "nats": "not connected"}
    assert (await http_get(f"{base}/api/jobs"))[0] == 503

    async def retrying() -> bool:
        return len(replica.events("PostgreSQL unreachable; waiting for it")) >= 2

    await eventually(retrying, timeout=30, what="the replica to wait for PostgreSQL")
    assert replica.returncode() is None, "the replica gave up instead of waiting"
    assert "hunter2" not in replica.stderr()

    # PostgreSQL becomes reachable on that port: the replica connects and starts.
    async with forward(closed, real.hostname or "127.0.0.1", real.port or 5432) as link:

        async def ready() -> bool:
            return (await http_get(f"{base}/readyz"))[0] == 200

        await eventually(ready, timeout=30, what="/readyz 200 once PostgreSQL answers")

        async def started() -> bool:  # the line is read from its stderr by a thread
            return bool(replica.events("replica started"))

        await eventually(started, timeout=10, what="the replica's 'replica started' line")

        # The database freezes (its connections stay open, nothing answers).
        link.freeze()

        async def unready() -> bool:
            status, body = await http_get(f"{base}/readyz")
            return status == 503 and json.loads(body)["checks"]["postgres"] != "ok"

        await eventually(unready, timeout=15, what="/readyz 503 with PostgreSQL frozen")
        status, body = await http_get(f"{base}/readyz")
        assert json.loads(body)["checks"]["postgres"] == "no answer within 2s"
        assert (await http_get(f"{base}/healthz"))[0] == 200
        status, text = await http_get(f"{base}/metrics", timeout=10)  # bounded reads
        assert status == 200
        assert sample(parse_metrics(text), "claimd_dependency_up", dependency="postgres") == 0
        link.thaw()
        await eventually(ready, timeout=60, what="/readyz 200 once PostgreSQL answers again")
        replica.terminate()
        assert await replica.wait(30) == 0


class Forwarder:
    """A TCP forwarder on loopback; ``frozen`` holds every byte (a server that froze)."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()

    def freeze(self) -> None:
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()


@contextlib.asynccontextmanager
async def forward(port: int, host: str, to_port: int) -> AsyncIterator[Forwarder]:
    """Listen on 127.0.0.1:``port`` and pipe every connection to ``host:to_port``."""
    forwarder = Forwarder()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await forwarder.flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.close()

    tasks: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, to_port)
        for task in (
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ):
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    try:
        yield forwarder
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def test_a_final_failure_is_one_error_line_with_its_error(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    jobs = f"""
[jobs.flaky]
cron = "{RARE_CRON}"
max_attempts = 2
backoff = {{ initial = "100ms", max = "100ms" }}
run = {{ shell = ["sh", "-c", "echo it broke >&2; exit 3"] }}
"""
    port = free_port()
    replica = spawn(
        "run",
        "--config",
        str(config(tmp_path, schema_url, nats_url, deployment, port, jobs)),
        label="replica",
    )
    conn = await asyncpg.connect(schema_url)
    try:
        await started(replica)
        (run_id,) = await insert_scheduled(conn, "flaky", 1)

        async def failed() -> bool:
            return (await states(conn, "flaky")).get("failed", 0) == 1

        await eventually(failed, timeout=30, what="the run to fail for good")
        error = await conn.fetchval("SELECT error FROM job_runs WHERE id = $1", run_id)
    finally:
        await conn.close()

    async def logged() -> bool:
        return bool(replica.events("run failed; no attempts left"))

    await eventually(logged, timeout=10, what="the final failure's log line")
    lines = [e for e in json_lines(replica.stderr()) if e.get("run_id") == run_id]
    final = [e for e in lines if e["event"] == "run failed; no attempts left"]
    assert len(final) == 1, lines
    assert final[0]["level"] == "error"
    assert final[0]["error"] == error == "exit status 3"
    assert (final[0]["job"], final[0]["attempt"], final[0]["outcome"]) == ("flaky", 2, "failed")
    retried = [e for e in lines if e["event"] == "run attempt failed; will retry"]
    assert [(e["level"], e["attempt"], e["error"]) for e in retried] == [
        ("warning", 1, "exit status 3")
    ]


async def test_a_nats_outage_under_a_running_replica_logs_json_lines_only(
    tmp_path: Path,
    schema_url: str,
    deployment: str,
    private_nats: PrivateNats,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    jobs = """
[jobs.beat]
every = "1s"
run = { shell = ["true"] }
"""
    port = free_port()
    # DEBUG: every library's chatter too (reconnect attempts included) must be JSON.
    replica = spawn(
        "--log-level",
        "DEBUG",
        "run",
        "--config",
        str(config(tmp_path, schema_url, private_nats.url, deployment, port, jobs)),
        label="replica",
    )
    await started(replica)
    conn = await asyncpg.connect(schema_url)
    try:

        async def beating() -> bool:
            return (await states(conn, "beat")).get("succeeded", 0) >= 2

        await eventually(beating, timeout=30, what="the job to run")

        before = len(replica.stderr().splitlines())
        private_nats.stop()
        outage_from = datetime.now(UTC)

        async def noticed() -> bool:
            # Lines logged since the stop (the lost connection, reconnect attempts).
            return len(replica.stderr().splitlines()) >= before + 5

        await eventually(noticed, timeout=30, what="log lines during the outage")
        private_nats.start()  # the same port and store

        async def recovered() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM job_runs WHERE state = 'succeeded' AND started_at > $1",
                    outage_from,
                )
            )

        await eventually(recovered, timeout=60, what="runs again after the outage")
    finally:
        await conn.close()
    replica.terminate()
    assert await replica.wait(30) == 0
    events = json_lines(replica.stderr())  # every single line is one JSON object
    during = events[before:]
    assert during, "nothing was logged during the outage"
    assert all("event" in e and "level" in e and "timestamp" in e for e in events)
    tracebacks = [e for e in events if "Traceback" in e.get("event", "")]
    assert tracebacks == [], "a traceback rendered into the message instead of its own field"
    print(
        f"\n[nats outage] {len(during)} JSON lines from the stop to the exit; loggers: "
        + ", ".join(sorted({str(e.get("logger") or e.get("actor")) for e in during}))
    )


async def test_job_histograms_off_exposes_one_series_for_all_jobs_through_the_real_port(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    """job_histograms = false: the two run histograms lose claimd_job; the counters keep it."""
    port = free_port()
    path = config(tmp_path, schema_url, nats_url, deployment, port, job_histograms=False)
    replica = spawn("run", "--config", str(path), label="replica")
    conn = await asyncpg.connect(schema_url)
    try:
        await started(replica)
        await insert_scheduled(conn, "ok", 2)
        await insert_scheduled(conn, "bad", 1)

        async def settled() -> bool:
            ok, bad = await states(conn, "ok"), await states(conn, "bad")
            return ok.get("succeeded", 0) == 2 and bad.get("failed", 0) == 1

        await eventually(settled, timeout=30, what="three runs recorded")
    finally:
        await conn.close()
    got = await metrics(port)
    for name in ("claimd_start_lag_seconds", "claimd_run_duration_seconds"):
        series = {labels for (n, labels) in got if n.startswith(name)}
        assert all("claimd_job" not in dict(labels) for labels in series), (name, series)
        assert got[(f"{name}_count", frozenset())] == 3
    assert got[("claimd_runs_started_total", frozenset({("claimd_job", "ok")}))] == 2
    assert got[("claimd_runs_started_total", frozenset({("claimd_job", "bad")}))] == 1

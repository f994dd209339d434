"""One clock: replicas whose own clocks are 10 minutes off lose nothing and invent nothing.

Real `claimd run` processes, two of them under libfaketime (Debian's
``faketime`` package) with their wall clock shifted +10 minutes and -10
minutes, beside one on the true clock, all on the test's schema and stream.
The monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as it
is on a host whose time is set wrong: asyncio's timers still work.

The jobs cover every catch-up policy (with the default window and with a
``catchup_window`` of one minute, far less than the skew), a starting
deadline, a cron job, and jobs first seen during the test, added by a reload
of the replica ahead and then of the one behind. Each scenario is judged in
SQL over the window from each job's creation to a chosen end: every due
instant has one row, succeeded, executed once; no row for an instant before
the job existed; nothing skipped, failed or missed; no row planned beyond the
database's horizon. The skew gauge and the warning are checked on each
replica, and so is the start lag, which is measured on the database's clock.

Before the fix (plans on the replica's own clock) every scenario fails: the
replica ahead drops still-future instants and starts new jobs ten minutes
late; the one behind writes runs for instants before the job existed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import parse_config
from tests.e2e.helpers import (
    ClaimdProcess,
    child_env,
    db_now,
    eventually,
    http_port_of,
    metric_total,
    query,
    scrape_metrics,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.clock_skew, pytest.mark.timeout(150)]

SKEW = "10m"
SKEW_S = 600.0
WINDOW_S = 20.0  # how long all replicas run together after the last reload
HORIZON = timedelta(minutes=2)
GRACE_S = 10


def libfaketime() -> str | None:
    """The multi-threaded libfaketime of the installed package (or CLAIMD_TEST_LIBFAKETIME)."""
    given = os.environ.get("CLAIMD_TEST_LIBFAKETIME")
    if given:
        return given if Path(given).exists() else None
    if shutil.which("dpkg") is None:
        return None
    listed = subprocess.run(
        ["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=False
    )
    found = [line for line in listed.stdout.splitlines() if line.endswith("/libfaketimeMT.so.1")]
    return found[0] if found and Path(found[0]).exists() else None


LIBFAKETIME = libfaketime()
if LIBFAKETIME is None:
    pytestmark.append(
        pytest.mark.skip(
            reason="libfaketime not installed (apt-get install faketime), or set "
            "CLAIMD_TEST_LIBFAKETIME to libfaketimeMT.so.1"
        )
    )


@dataclass(frozen=True)
class Spec:
    """A job of the test, and its schedule as the test computes it (not claimd's code)."""

    name: str
    toml: str
    every_s: int  # 60 for the cron job "* * * * *" (UTC minutes)

    def instants(self, after: datetime, until: datetime) -> list[datetime]:
        """Multiples of ``every_s`` since the Unix epoch in ``(after, until]``."""
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        k = int((after - epoch).total_seconds() // self.every_s) + 1
        out = []
        while (t := epoch + timedelta(seconds=k * self.every_s)) <= until:
            if t > after:
                out.append(t)
            k += 1
        return out


def shell_job(name: str, schedule: str, every_s: int, extra: str = "") -> Spec:
    return Spec(
        name,
        f'[jobs.{name}]\n{schedule}\ntimeout = "10s"\n{extra}run = {{ shell = ["true"] }}\n\n',
        every_s,
    )


# Every 2 s for latest/none: the instants due between a job's creation and its
# first plan are then at most one, so `latest` has nothing to supersede.
JOBS = [
    shell_job("all-1s", 'every = "1s"', 1),
    shell_job("all-1s-window-1m", 'every = "1s"', 1, 'catchup_window = "1m"\n'),
    shell_job("latest-2s", 'every = "2s"', 2, 'catchup = "latest"\n'),
    shell_job(
        "latest-2s-window-1m", 'every = "2s"', 2, 'catchup = "latest"\ncatchup_window = "1m"\n'
    ),
    shell_job("none-2s", 'every = "2s"', 2, 'catchup = "none"\n'),
    shell_job("deadline-1s", 'every = "1s"', 1, 'starting_deadline = "30s"\n'),
    shell_job("cron-minute", 'cron = "* * * * *"', 60, 'catchup = "none"\n'),
]
# First seen during the test: added by a reload of the replica ahead, then behind.
ADDED_BY_AHEAD = shell_job(
    "added-by-ahead", 'every = "1s"', 1, 'catchup = "latest"\ncatchup_window = "1m"\n'
)
ADDED_BY_BEHIND = shell_job("added-by-behind", 'every = "2s"', 2, 'catchup = "none"\n')

REPLICA_SKEW = {"true": None, "ahead": f"+{SKEW}", "behind": f"-{SKEW}"}


class Cluster:
    """The replicas of one scenario, sharing one config file (reloads reread it)."""

    def __init__(self, workdir: Path, schema_url: str, nats_url: str, deployment: str) -> None:
        self.workdir = workdir
        self.schema_url = schema_url
        self.config = workdir / "claimd.toml"
        self.settings: dict[str, str | int] = {
            "database_url": schema_url,
            "nats_url": nats_url,
            "deployment": deployment,
            "http": "127.0.0.1:0",
            "shutdown_grace": f"{GRACE_S}s",
            "claim_interval": "100ms",
            "materialize_interval": "500ms",
            "horizon": f"{int(HORIZON.total_seconds())}s",
            # The reloads here are SIGHUPs to one replica at a time, as the scenario
            # says; the file watch would reload all three at each write (one file).
            "config_poll": "0s",
        }
        self.replicas: dict[str, ClaimdProcess] = {}
        self.write_jobs(JOBS)

    def write_jobs(self, specs: list[Spec]) -> None:
        write_config(self.config, jobs="".join(s.toml for s in specs), **self.settings)

    def start(self, name: str) -> ClaimdProcess:
        skew = REPLICA_SKEW[name]
        extra = (
            {}
            if skew is None
            else {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME": skew,
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        )
        process = ClaimdProcess(
            ["run", "--config", str(self.config)], self.workdir, name, env=child_env(**extra)
        )
        self.replicas[name] = process.start()
        return process

    async def started(self, *names: str) -> None:
        async def up() -> bool:
            for name in names:
                p = self.replicas[name]
                assert p.returncode() is None, f"{name} exited:\n{p.stderr()[-3000:]}"
            return all(self.replicas[n].events("replica started") for n in names)

        await eventually(up, timeout=60, what=f"replicas {names} to start")

    async def reload(self, name: str, specs: list[Spec]) -> None:
        self.write_jobs(specs)
        process = self.replicas[name]
        before = len(process.events("reloaded"))
        os.kill(process.pid, signal.SIGHUP)

        async def reloaded() -> bool:
            return len(process.events("reloaded")) > before

        await eventually(reloaded, timeout=30, what=f"{name} to reload")

    def kill_all(self) -> None:
        for p in self.replicas.values():
            p.kill()


@pytest.fixture
def cluster(tmp_path: Path, schema_url: str, nats_url: str, deployment: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, schema_url, nats_url, deployment)
    yield c
    c.kill_all()


async def created(url: str) -> dict[str, datetime]:
    try:
        rows = await query(url, "SELECT name, created_at FROM jobs")
    except asyncpg.UndefinedTableError:
        return {}
    return {r["name"]: r["created_at"] for r in rows}


async def succeeded_in(url: str, job: str, after: datetime, until: datetime) -> int:
    rows = await query(
        url,
        "SELECT count(*) AS n FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = $1 AND r.state = 'succeeded' AND r.scheduled_at > $2 "
        "AND r.scheduled_at <= $3",
        job,
        after,
        until,
    )
    n: int = rows[0]["n"]
    return n


async def first_runs_succeeded(url: str, job: str, count: int) -> bool:
    try:
        return (
            await succeeded_in(
                url, job, datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)
            )
            >= count
        )
    except asyncpg.UndefinedTableError:  # not migrated yet
        return False


async def run_scenario(cluster: Cluster, order: list[str]) -> None:
    """Start ``order[0]`` alone on the empty schema, then the others; reload the replica
    ahead and then the one behind with a new job each; run; judge."""
    url = cluster.schema_url
    first = order[0]
    cluster.start(first)
    await cluster.started(first)

    async def first_alone_ran() -> bool:
        assert cluster.replicas[first].returncode() is None, cluster.replicas[first].stderr()
        return await first_runs_succeeded(url, "all-1s", 2)

    await eventually(first_alone_ran, timeout=60, what=f"{first} alone to run all-1s")
    for name in order[1:]:
        cluster.start(name)
    await cluster.started(*order)
    await cluster.reload("ahead", [*JOBS, ADDED_BY_AHEAD])
    await cluster.reload("behind", [*JOBS, ADDED_BY_AHEAD, ADDED_BY_BEHIND])
    specs = [*JOBS, ADDED_BY_AHEAD, ADDED_BY_BEHIND]

    # Run together for a while (a run length, not an ordering: judged after).
    start = await db_now(url)

    async def window_passed() -> bool:
        for p in cluster.replicas.values():
            assert p.returncode() is None, f"{p.label} exited:\n{p.stderr()[-3000:]}"
        return (await db_now(url) - start).total_seconds() >= WINDOW_S

    await eventually(window_passed, timeout=WINDOW_S + 30, what="the run window", interval=0.5)
    end = await db_now(url)
    born = await created(url)
    assert set(born) == {s.name for s in specs}

    async def all_due_succeeded() -> bool:
        for s in specs:
            due = s.instants(born[s.name], end)
            if await succeeded_in(url, s.name, born[s.name], end) < len(due):
                return False
        return True

    # Generous: a replica that lost instants never gets there; the judgement below says why.
    with_reason = None
    try:
        await eventually(all_due_succeeded, timeout=20, what="every due instant to succeed")
    except AssertionError as exc:
        with_reason = exc

    metrics = {
        name: await asyncio.to_thread(scrape_metrics, port_of(p))
        for name, p in cluster.replicas.items()
    }
    for p in cluster.replicas.values():
        p.terminate()
    for p in cluster.replicas.values():
        code = await p.wait(GRACE_S + 15)
        assert code == 0, f"{p.label} exited {code}:\n{p.stderr()[-3000:]}"

    await judge(url, specs, born, end)
    if with_reason is not None:
        raise with_reason
    judge_metrics(cluster, metrics)


def port_of(process: ClaimdProcess) -> int:
    port = http_port_of(process)
    assert port is not None, f"{process.label} did not log its HTTP port"
    return port


async def judge(url: str, specs: list[Spec], born: dict[str, datetime], end: datetime) -> None:
    """The promises over the window, in SQL."""
    rows = await query(
        url,
        "SELECT j.name, r.id::text AS id, r.scheduled_at, r.state, r.trigger, r.error, "
        "r.started_at < r.due_at AS early, "
        "(SELECT count(*) FROM job_run_attempts a WHERE a.run_id = r.id) AS attempts "
        "FROM job_runs r JOIN jobs j ON j.id = r.job_id ORDER BY j.name, r.scheduled_at",
    )
    marks = {
        r["name"]: r["materialized_until"]
        for r in await query(url, "SELECT name, materialized_until FROM jobs")
    }
    problems: list[str] = []
    for s in specs:
        mine = [r for r in rows if r["name"] == s.name]
        # Planned ahead too: every instant up to the job's high-water mark has a row
        # (a plan that called future instants past and dropped them leaves a gap here).
        planned = {r["scheduled_at"] for r in mine}
        gap = [t for t in s.instants(born[s.name], marks[s.name]) if t not in planned]
        if gap:
            problems.append(
                f"{s.name}: {len(gap)} instants up to the high-water mark "
                f"{marks[s.name].isoformat()} were never planned, e.g. "
                f"{[t.isoformat() for t in gap[:3]]}"
            )
        invented = [
            r["scheduled_at"].isoformat() for r in mine if r["scheduled_at"] <= born[s.name]
        ]
        if invented:
            problems.append(
                f"{s.name}: {len(invented)} runs for instants before the job "
                f"existed ({born[s.name].isoformat()}), e.g. {invented[:3]}"
            )
        in_window = [r for r in mine if born[s.name] < r["scheduled_at"] <= end]
        due = s.instants(born[s.name], end)
        got = [r["scheduled_at"] for r in in_window]
        missing = sorted(set(due) - set(got))
        if missing:
            problems.append(
                f"{s.name}: {len(missing)} of {len(due)} due instants have no "
                f"row, e.g. {[t.isoformat() for t in missing[:3]]}"
            )
        off_grid = sorted(set(got) - set(due))
        if off_grid:
            problems.append(f"{s.name}: rows off the schedule {off_grid[:3]}")
        not_done = [
            (r["scheduled_at"].isoformat(), r["state"], r["error"])
            for r in in_window
            if r["state"] != "succeeded"
        ]
        if not_done:
            problems.append(
                f"{s.name}: {len(not_done)} due runs not succeeded, e.g. {not_done[:3]}"
            )
        repeated = [
            r["scheduled_at"].isoformat()
            for r in in_window
            if r["state"] == "succeeded" and r["attempts"] != 1
        ]
        if repeated:
            problems.append(f"{s.name}: runs with other than one attempt {repeated[:3]}")
        # Runs are claimed ahead and held until due: by the database's clock, a
        # skewed worker's hold must not end early.
        early = [r["scheduled_at"].isoformat() for r in mine if r["early"]]
        if early:
            problems.append(f"{s.name}: {len(early)} runs started before due, e.g. {early[:3]}")
    dropped = [
        (r["name"], r["scheduled_at"].isoformat(), r["state"], r["error"])
        for r in rows
        if r["state"] in ("skipped", "failed", "cancelled")
    ]
    if dropped:
        problems.append(f"{len(dropped)} runs skipped/failed/cancelled, e.g. {dropped[:3]}")
    scheduled = [r["scheduled_at"] for r in rows if r["trigger"] == "schedule"]
    now = await db_now(url)
    if scheduled and max(scheduled) > now + HORIZON + timedelta(seconds=5):
        problems.append(
            f"rows planned beyond the database's horizon: latest "
            f"{max(scheduled).isoformat()}, database now {now.isoformat()}"
        )
    assert problems == [], "\n".join(problems)
    judged = sum(len(s.instants(born[s.name], end)) for s in specs)
    print(
        f"\n[clock skew] {judged} due instants of {len(specs)} jobs judged: each one row, "
        f"succeeded, one attempt, none started before due; 0 invented, 0 skipped/failed/missed"
    )


def judge_metrics(cluster: Cluster, metrics: dict[str, dict[str, float]]) -> None:
    """Nothing missed; each replica measured its skew; start lag is on the database's clock."""
    for name, samples in metrics.items():
        process = cluster.replicas[name]
        assert metric_total(samples, "claimd_runs_missed_total") == 0, name
        assert not process.events("missed instants dropped by catch-up policy"), name
        skew = samples["claimd_clock_skew_seconds"]
        warned = process.events(
            "clock skew: this replica's clock disagrees with the database's; claimd decides "
            "on the database's clock, fix the host's time sync"
        )
        expected = {"true": 0.0, "ahead": SKEW_S, "behind": -SKEW_S}[name]
        assert abs(skew - expected) < 5, f"{name}: claimd_clock_skew_seconds = {skew}"
        assert bool(warned) == (name != "true"), f"{name}: skew warnings {warned}"
        started = metric_total(samples, "claimd_start_lag_seconds_count")
        if started:
            mean_lag = metric_total(samples, "claimd_start_lag_seconds_sum") / started
            assert abs(mean_lag) < 60, f"{name}: mean start lag {mean_lag:.1f}s"
    executed = {n for n, s in metrics.items() if metric_total(s, "claimd_start_lag_seconds_count")}
    assert executed & {"ahead", "behind"}, f"no skewed replica executed a run: {executed}"
    print(
        "\n[clock skew] gauges: "
        + json.dumps({n: round(s["claimd_clock_skew_seconds"], 3) for n, s in metrics.items()})
        + "; runs started per replica: "
        + json.dumps(
            {n: metric_total(s, "claimd_start_lag_seconds_count") for n, s in metrics.items()}
        )
    )


async def test_replicas_ten_minutes_ahead_and_behind_beside_a_true_clock(cluster: Cluster) -> None:
    await run_scenario(cluster, ["true", "ahead", "behind"])


async def test_the_replica_ahead_starts_first_on_an_empty_database(cluster: Cluster) -> None:
    await run_scenario(cluster, ["ahead", "behind", "true"])


async def test_the_replica_behind_starts_first_on_an_empty_database(cluster: Cluster) -> None:
    await run_scenario(cluster, ["behind", "ahead", "true"])


async def test_trigger_without_at_takes_the_database_instant(
    cluster: Cluster, store: PostgresRunStore
) -> None:
    """`claimd trigger JOB` on a host 10 minutes ahead: the run's instant is the database's now."""
    await store.sync_jobs(
        [parse_config(cluster.config.read_text(), str(cluster.config), env={}).jobs["all-1s"]]
    )
    before = await db_now(cluster.schema_url)
    trigger = ClaimdProcess(
        ["trigger", "all-1s", "--config", str(cluster.config)],
        cluster.workdir,
        "trigger",
        env=child_env(
            LD_PRELOAD=str(LIBFAKETIME), FAKETIME=f"+{SKEW}", FAKETIME_DONT_FAKE_MONOTONIC="1"
        ),
    ).start()
    assert await trigger.wait(60) == 0, trigger.stderr()
    after = await db_now(cluster.schema_url)
    rows = await query(
        cluster.schema_url, "SELECT scheduled_at FROM job_runs WHERE trigger = 'manual'"
    )
    assert len(rows) == 1, trigger.stdout()
    assert before <= rows[0]["scheduled_at"] <= after, (
        f"triggered at {rows[0]['scheduled_at'].isoformat()}, database clock between "
        f"{before.isoformat()} and {after.isoformat()}"
    )

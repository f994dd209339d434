"""A rolling deploy and a config file changed on disk, through real `claimd run` replicas.

Rolling deploy (issue 22): replica A runs the new file (jobs a and x); B starts
after it on the previous file (no x), and is restarted mid-roll. B's syncs are
refused as older than the generation in force: x keeps every instant, no run
of it is cancelled; the disagreement is in B's and A's gauges, in `claimd jobs`
and in /api/status. Then `claimd reload --force` on B rolls back (x removed),
recorded in the action log.

Config file changed on disk (issue 27): a ConfigMap-style symlink swap is
reloaded by the replica within its poll interval, with the verdict SIGHUP gives.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from actors.domain.runs import REMOVED_FROM_CONFIG
from tests.e2e.helpers import (
    ClaimdProcess,
    check_effectively_once,
    db_now,
    effect_job,
    eventually,
    http_port_of,
    query,
    read_effects,
    scrape_metrics,
)
from tests.e2e.test_cli import run_config, spawn
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
__all__ = ["spawn"]  # the fixture, shared with test_cli


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


async def started(replica: ClaimdProcess, after: int = 0) -> int:
    """Wait for the replica's (after-th) 'replica started' line; its HTTP port."""

    async def up() -> bool:
        assert replica.returncode() is None, replica.stderr()[-3000:]
        return len(replica.events("replica started")) > after

    await eventually(up, timeout=45, what=f"{replica.label} to start")
    port = http_port_of(replica)
    assert port is not None
    return port


STALE = "config file older than the generation in force; running the jobs in force"


async def x_runs_cancelled_by_removal(schema_url: str) -> int:
    rows = await query(
        schema_url,
        "SELECT count(*) AS n FROM job_runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = 'x' AND r.state = 'cancelled' AND r.error = $1",
        REMOVED_FROM_CONFIG,
    )
    return int(rows[0]["n"])


async def test_a_rolling_deploy_keeps_the_new_job_and_a_forced_reload_rolls_back(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    effects = tmp_path / "effects.log"
    new_jobs = effect_job("a", effects) + effect_job("x", effects)
    new = run_config(
        tmp_path / "new.toml", schema_url, nats_url, deployment, new_jobs, config_poll="2s"
    )
    old = run_config(
        tmp_path / "old.toml",
        schema_url,
        nats_url,
        deployment,
        effect_job("a", effects),
        config_poll="2s",
    )
    replicas: list[ClaimdProcess] = []

    def spawn(label: str, config: Path) -> ClaimdProcess:
        args = ["run", "--config", str(config), "--pid-file", str(tmp_path / f"{label}.pid")]
        process = ClaimdProcess(args, tmp_path, label).start()
        replicas.append(process)
        return process

    try:
        began = time.monotonic()
        # The deployment as it was: B on the previous file (generation 1).
        b = spawn("b0", old)
        await started(b)
        # The roll begins: A on the new file (a digest never seen: generation 2).
        a = spawn("a", new)
        port_a = await started(a)

        async def x_ran_after(at: Any) -> bool:
            return any(e.job == "x" and e.scheduled_at > at for e in read_effects(effects))

        t0 = await db_now(schema_url)
        await eventually(lambda: x_ran_after(t0), timeout=30, what="x to run on A")

        # B restarts still on the previous file (its pod not rolled yet).
        b.terminate()
        assert await b.wait(30) == 0
        b1 = b = spawn("b1", old)
        port_b = await started(b)
        # Mid-roll, B restarts again (still on the old file).
        b.terminate()
        assert await b.wait(30) == 0
        b = spawn("b2", old)
        port_b = await started(b)
        t1 = await db_now(schema_url)
        # x keeps every instant through both of B's syncs (before: each removed it).
        assert await x_runs_cancelled_by_removal(schema_url) == 0
        await eventually(
            lambda: x_ran_after(t1 + timedelta(seconds=2)),
            timeout=30,
            what="x to keep running after B's restart on the old file",
        )
        assert await x_runs_cancelled_by_removal(schema_url) == 0
        for stale_start in (b1, b):
            assert stale_start.events(STALE), f"{stale_start.label}'s sync was not refused"

        # The disagreement, seen: B's gauge, A's cluster gauge, `claimd jobs`, /api/status.
        b_metrics = scrape_metrics(port_b)
        assert b_metrics["claimd_config_stale"] == 1.0

        async def two_digests() -> bool:
            return scrape_metrics(port_a).get("claimd_config_digests") == 2.0

        await eventually(two_digests, timeout=15, what="A's gauge of distinct digests to be 2")
        jobs = await claimd("jobs", "--database-url", schema_url)
        assert jobs.code == 0, jobs
        assert "replicas disagree: 1 on digest" in jobs.out, jobs.out
        assert "refused: older than the one in force" in jobs.out, jobs.out
        status = get_json(port_a, "/api/status")["config"]
        assert status["disagreement"].startswith("replicas disagree: "), status
        assert status["in_force"]["generation"] == 2
        stale = [r for r in status["replicas"] if r["stale"]]
        assert [r["in_force"] for r in stale] == [False]

        # The explicit rollback: B's file (no x) becomes the generation in force.
        forced = await claimd(
            "reload", "--force", "--pid", str(b.pid), "--database-url", schema_url
        )
        assert forced.code == 0, forced
        assert f"process {b.pid}: reloaded (forced): jobs 0 added, 0 changed, 1 removed" in (
            forced.out
        ), forced
        actions = await query(
            schema_url,
            "SELECT actor, via, ok, arguments FROM operator_actions "
            "WHERE action = 'reload' ORDER BY id",
        )
        recorded = [(r["via"], json.loads(r["arguments"]).get("force")) for r in actions]
        assert ("signal", True) in recorded, recorded  # the replica's verdict
        assert ("cli", True) in recorded, recorded  # the operator's act
        generations = await query(
            schema_url, "SELECT seq, forced FROM config_generations ORDER BY seq"
        )
        assert [(g["seq"], g["forced"]) for g in generations] == [
            (1, False),
            (2, False),
            (3, True),
        ]
        assert scrape_metrics(port_b)["claimd_config_stale"] == 0.0

        # Every instant of x from its first run to its removal: one run, succeeded.
        async def x_settled() -> bool:
            rows = await query(
                schema_url,
                "SELECT count(*) AS n FROM job_runs r JOIN jobs j ON j.id = r.job_id "
                "WHERE j.name = 'x' AND r.state IN ('pending', 'claimed', 'running')",
            )
            return int(rows[0]["n"]) == 0

        await eventually(x_settled, timeout=20, what="x's runs to settle after its removal")
        figures = await check_effectively_once(schema_url, "x", read_effects(effects))
        assert figures.first < t0 + timedelta(seconds=1)
        assert figures.last > t1
        print(
            f"\nrolling deploy: x {figures.succeeded} instants in a row through 2 stale syncs, "
            f"0 cancelled before the rollback; test took {time.monotonic() - began:.1f}s"
        )
        for process in replicas:
            process.terminate()
        for process in replicas:
            await process.wait(30)
    finally:
        for process in replicas:
            process.kill()


def swap(folder: Path, version: str) -> None:
    """What the kubelet does to a ConfigMap volume: ``..data`` now names another folder."""
    tmp = folder / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version)
    os.replace(tmp, folder / "..data")


async def test_a_config_file_swapped_on_disk_is_reloaded_within_the_poll_interval(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    tick = '[jobs.{name}]\nevery = "1s"\nrun = {{ shell = ["/bin/true"] }}\n\n'
    for version, jobs in [
        ("v1", tick.format(name="a")),
        ("v2", tick.format(name="a") + tick.format(name="b")),
        (
            "v3",
            tick.format(name="a")
            + '[jobs.b]\ncron = "61 * * * *"\nrun = {{ shell = ["/bin/true"] }}\n',
        ),
    ]:
        (volume / version).mkdir()
        run_config(
            volume / version / "claimd.toml",
            schema_url,
            nats_url,
            deployment,
            jobs,
            config_poll="1s",
        )
    swap(volume, "v1")
    (volume / "claimd.toml").symlink_to("..data/claimd.toml")
    replica = spawn("run", "--config", str(volume / "claimd.toml"))
    await started(replica)

    async def watch_verdicts() -> list[tuple[bool, str, dict[str, Any]]]:
        rows = await query(
            schema_url,
            "SELECT ok, result, arguments FROM operator_actions "
            "WHERE action = 'reload' AND actor = 'config-watch' ORDER BY id",
        )
        return [(r["ok"], r["result"], json.loads(r["arguments"])) for r in rows]

    timings = []
    for version, count in [("v2", 1), ("v3", 2)]:
        swapped = time.monotonic()
        swap(volume, version)

        async def reloaded(count: int = count) -> bool:
            return len(await watch_verdicts()) >= count

        await eventually(reloaded, timeout=15, what=f"the replica to reload {version}")
        timings.append(time.monotonic() - swapped)
    verdicts = await watch_verdicts()
    # The verdicts SIGHUP gives (actors.replica.reload), recorded as the watch's.
    assert [(ok, result) for ok, result, _ in verdicts] == [
        (True, "reloaded: jobs 1 added, 0 changed, 0 removed"),
        (False, "refused: the file has 1 error; jobs unchanged"),
    ]
    assert verdicts[0][2]["trigger"] == "file changed"
    assert verdicts[0][2]["added"]["names"] == ["b"]
    assert [e["changes"] for e in replica.events("reloaded")] == [{"b": "added"}]
    assert replica.events("config file changed; reloading")
    # Within the poll interval (1 s) and the reload itself; generous for a loaded machine.
    assert max(timings) < 10, timings
    print(f"\nconfig swap to reload verdict: {', '.join(f'{t:.2f}s' for t in timings)}")

"""The fault-injection harness in CI: short seeded storms (process faults, network
faults), and a broken build it must catch.

The harness's progress and table go straight to the terminal (also under
``pytest -q``), so the CI log shows the figures. The long run is on demand:
``python -m tests.chaos --seed 7 --duration 300 --replicas 4 --jobs 100 --embedded``.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.chaos.faults import NETWORK_KINDS, PROCESS_KINDS, FaultKind
from tests.chaos.harness import ChaosResult, Options, run_chaos

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

SEED = int(os.environ.get("CLAIMD_CHAOS_SEED", "1"))


async def _run(capsys: pytest.CaptureFixture[str], options: Options) -> ChaosResult:
    with capsys.disabled():
        print(file=sys.stdout)
        return await run_chaos(options, sys.stdout)


async def test_short_seeded_run_loses_nothing_and_doubles_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Embedded PostgreSQL so that PostgreSQL restarts are among the faults
    # (the machine's shared server is never restarted); own nats-server.
    result = await _run(
        capsys,
        Options(seed=SEED, duration=45, replicas=3, jobs=50, embedded=True, kinds=PROCESS_KINDS),
    )
    report = result.report
    injected = {record.fault.kind for record in result.faults}
    assert injected == set(PROCESS_KINDS), (
        f"every process fault kind must be injected; missing {set(PROCESS_KINDS) - injected}, "
        f"skipped {result.skipped}\n{result.table}"
    )
    assert report.due > 1000, result.table
    assert report.recorded == report.due, result.table
    assert report.lost == 0, result.table
    assert report.doubled == 0, result.table
    assert report.fencing_violations == 0, result.table
    assert result.failures == [], result.table


async def test_network_faults_lose_nothing_and_every_replica_recovers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Every replica reaches PostgreSQL and NATS through proxies of its own; the
    # plan blackholes each link of a replica past the lease, both at once,
    # resets them repeatedly, slows them, and SIGTERMs a replica whose links are
    # blackholed. The machine's PostgreSQL is enough (nothing restarts it).
    result = await _run(
        capsys, Options(seed=SEED, duration=45, replicas=3, jobs=50, kinds=NETWORK_KINDS)
    )
    report = result.report
    injected = {record.fault.kind for record in result.faults}
    assert injected == set(NETWORK_KINDS), (
        f"every network fault kind must be injected; missing {set(NETWORK_KINDS) - injected}"
        f"\n{result.table}"
    )
    assert report.due > 1000, result.table
    assert report.lost == 0, result.table
    assert report.doubled == 0, result.table
    assert report.fencing_violations == 0, result.table
    # Liveness: every replica started runs again within lease + margin of each
    # heal and of the end of the faults; every SIGTERM stop ended within its bound.
    assert result.liveness, result.table
    assert all(v.ok for v in result.liveness), result.table
    assert result.stops, result.table
    assert not [s for s in result.stops if s.killed], result.table
    assert result.unplanned_exits == [], result.table
    assert result.failures == [], result.table


async def test_broken_build_without_the_epoch_guard_is_caught(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Completions lose their epoch guard (the harness's own broken build,
    # tests/chaos/broken.py, started through tests/chaos/broken_replica.py): a
    # replica paused past its lease wakes up and records its stale execution
    # over the newer attempt.
    # The harness exists to catch exactly this; if it passed, it would prove nothing.
    with capsys.disabled():
        print("\n[chaos] deliberately broken build: this run is expected to FAIL its invariants")
    # A zombie overwrites a newer attempt only when it was frozen after its job
    # finished and before the verdict was recorded; a woken zombie whose
    # heartbeat is refused first cancels instead. Which happens is timing, so
    # the broken build gets up to three seeded storms to show itself: a harness
    # that misses it three times in a row is what this test exists to catch.
    for attempt in range(3):
        result = await _run(
            capsys,
            Options(
                seed=SEED + 1 + 100 * attempt,
                duration=25,
                replicas=3,
                jobs=20,
                slow_jobs=10,
                kinds=[FaultKind.ZOMBIE],
                broken_build="epoch-guard",
            ),
        )
        # The violation itself, not any failure: the run now also fails on
        # liveness and stop bounds, which say nothing about the epoch guard.
        if result.report.fencing_violations > 0:
            break
        with capsys.disabled():
            print(f"[chaos] storm {attempt + 1}: no zombie completed late; another seed")
    assert sum(r.fault.kind is FaultKind.ZOMBIE for r in result.faults) >= 2, result.table
    assert not result.ok, result.table
    assert result.report.fencing_violations > 0, result.table
    assert any(f.startswith("(5)") for f in result.failures), result.table
    assert "RESULT: FAIL" in result.table

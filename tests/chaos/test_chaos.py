"""The fault-injection harness in CI: a short seeded storm, and a broken build it must catch.

The harness's progress and table go straight to the terminal (also under
``pytest -q``), so the CI log shows the figures. The long run is on demand:
``python -m tests.chaos --seed 7 --duration 300 --replicas 4 --jobs 100 --embedded``.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.chaos.faults import FaultKind
from tests.chaos.harness import ChaosResult, Options, run_chaos

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

SEED = int(os.environ.get("CLAIMD_CHAOS_SEED", "1"))


async def _run(capsys: pytest.CaptureFixture[str], options: Options) -> ChaosResult:
    with capsys.disabled():
        print(file=sys.stdout)
        return await run_chaos(options, sys.stdout)


async def test_short_seeded_run_loses_nothing_and_doubles_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Embedded PostgreSQL so that PostgreSQL restarts are among the faults
    # (the machine's shared server is never restarted); own nats-server.
    result = await _run(capsys, Options(seed=SEED, duration=45, replicas=3, jobs=50,
                                        embedded=True))
    report = result.report
    injected = {record.fault.kind for record in result.faults}
    assert injected == set(FaultKind), (
        f"every fault kind must be injected; missing {set(FaultKind) - injected}, "
        f"skipped {result.skipped}\n{result.table}")
    assert report.due > 1000, result.table
    assert report.recorded == report.due, result.table
    assert report.lost == 0, result.table
    assert report.doubled == 0, result.table
    assert report.fencing_violations == 0, result.table
    assert result.failures == [], result.table


async def test_broken_build_without_the_epoch_guard_is_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The completion statement loses its epoch guard: a replica paused past its
    # lease wakes up and records its stale execution over the newer attempt.
    # The harness exists to catch exactly this; if it passed, it would prove nothing.
    with capsys.disabled():
        print("\n[chaos] deliberately broken build: this run is expected to FAIL its invariants")
    # A zombie overwrites a newer attempt only when it was frozen after its job
    # finished and before the verdict was recorded; a woken zombie whose
    # heartbeat is refused first cancels instead. Which happens is timing, so
    # the broken build gets up to three seeded storms to show itself: a harness
    # that misses it three times in a row is what this test exists to catch.
    for attempt in range(3):
        result = await _run(capsys, Options(seed=SEED + 1 + 100 * attempt, duration=25,
                                            replicas=3, jobs=20, slow_jobs=10,
                                            kinds=[FaultKind.ZOMBIE],
                                            broken_build="epoch-guard"))
        if not result.ok:
            break
        with capsys.disabled():
            print(f"[chaos] storm {attempt + 1}: no zombie completed late; another seed")
    assert sum(r.fault.kind is FaultKind.ZOMBIE for r in result.faults) >= 2, result.table
    assert not result.ok, result.table
    assert result.report.fencing_violations > 0, result.table
    assert any(f.startswith("(5)") for f in result.failures), result.table
    assert "RESULT: FAIL" in result.table

"""Run states: the transitions the state machine allows, the ones it refuses, terminal states."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from actors.domain import (
    TERMINAL_STATES,
    IllegalTransition,
    RunContext,
    RunState,
    check_transition,
)

P, C, R = RunState.PENDING, RunState.CLAIMED, RunState.RUNNING
OK, FAIL, SKIP, CANCEL = (RunState.SUCCEEDED, RunState.FAILED, RunState.SKIPPED, RunState.CANCELLED)

# The design, written out independently of the code under test:
# pending -> claimed -> running -> succeeded | failed | (retry) pending,
# claimed -> pending (publish failed, lease expired), pending/claimed -> skipped,
# any live state -> cancelled.
ALLOWED = {
    (P, C),
    (P, SKIP),
    (P, CANCEL),
    (C, R),
    (C, P),
    (C, SKIP),
    (C, CANCEL),
    (R, OK),
    (R, FAIL),
    (R, P),
    (R, CANCEL),
}
ALL_PAIRS = list(itertools.product(RunState, RunState))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in ALLOWED]


@pytest.mark.parametrize(("current", "target"), sorted(ALLOWED))
def test_allowed_transitions(current: RunState, target: RunState) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(("current", "target"), FORBIDDEN)
def test_forbidden_transitions(current: RunState, target: RunState) -> None:
    with pytest.raises(IllegalTransition, match=f"cannot go from {current} to {target}"):
        check_transition(current, target)


def test_the_matrix_is_complete() -> None:
    assert len(ALL_PAIRS) == 49
    assert len(FORBIDDEN) == 49 - 11
    # Notable refusals: no skipping the start, no resurrection, no retry from claimed
    # straight to a verdict.
    for pair in [
        (P, R),
        (P, OK),
        (C, OK),
        (C, FAIL),
        (OK, P),
        (FAIL, P),
        (CANCEL, P),
        (SKIP, C),
        (R, SKIP),
        (R, C),
        (P, P),
        (R, R),
    ]:
        assert pair in FORBIDDEN


def test_terminal_states() -> None:
    assert {OK, FAIL, SKIP, CANCEL} == TERMINAL_STATES
    assert all(s.terminal for s in TERMINAL_STATES)
    assert not any(s.terminal for s in (P, C, R))
    for state in TERMINAL_STATES:
        for target in RunState:
            with pytest.raises(IllegalTransition):
                check_transition(state, target)


def test_every_live_state_can_end() -> None:
    # No state is a trap: from each live state some path reaches a terminal state.
    for state in (P, C, R):
        assert any((state, t) in ALLOWED for t in TERMINAL_STATES)
        check_transition(state, CANCEL)


def test_state_values_are_the_database_words() -> None:
    assert [s.value for s in RunState] == [
        "pending",
        "claimed",
        "running",
        "succeeded",
        "failed",
        "skipped",
        "cancelled",
    ]
    assert RunState("succeeded") is OK


def test_run_context_tells_the_run() -> None:
    ctx = RunContext(
        run_id="0b5c7a52-3f3e-4e0e-9d51-6a1d2c3b4a59",
        job="nightly-export",
        scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        attempt=2,
        fencing_token=7,
    )
    assert ctx.env() == {
        "CLAIMD_RUN_ID": "0b5c7a52-3f3e-4e0e-9d51-6a1d2c3b4a59",
        "CLAIMD_JOB": "nightly-export",
        "CLAIMD_SCHEDULED_AT": "2026-03-29T01:00:00+00:00",
        "CLAIMD_ATTEMPT": "2",
        "CLAIMD_FENCING_TOKEN": "7",
    }
    assert ctx.headers()["Idempotency-Key"] == ctx.run_id
    assert ctx.headers()["Claimd-Fencing-Token"] == "7"
    assert ctx.template_values()["scheduled_date"] == "2026-03-29"

"""The one decision after an attempt: next state, attempt and due delay, for every ending."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actors.domain import (
    UNREADABLE_RETRY,
    AttemptVerdict,
    IllegalTransition,
    Outcome,
    RetryPolicy,
    RunState,
    decide_attempt,
)

POLICY = RetryPolicy(timedelta(seconds=2), timedelta(seconds=60), 3.0)
P, C, R = RunState.PENDING, RunState.CLAIMED, RunState.RUNNING


def verdict(
    outcome: Outcome,
    state: RunState = R,
    attempt: int = 1,
    max_attempts: int = 3,
    policy: RetryPolicy | None = POLICY,
) -> AttemptVerdict:
    return decide_attempt(
        outcome,
        state=state,
        attempt=attempt,
        max_attempts=max_attempts,
        policy=policy,
        run_id="run-1",
    )


def test_success_is_final_whatever_the_attempt() -> None:
    assert verdict(Outcome.SUCCEEDED, attempt=3) == AttemptVerdict(RunState.SUCCEEDED, 3)


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.TIMED_OUT, Outcome.CANCELLED])
def test_a_failed_attempt_retries_after_the_policys_backoff_until_the_limit(
    outcome: Outcome,
) -> None:
    second = verdict(outcome, attempt=2)
    assert (second.state, second.attempt) == (P, 3)
    # 2s x 3^(2-1) = 6s, less up to 20% from the run id: every replica agrees.
    assert second.due_in == POLICY.delay(2, "run-1")
    assert timedelta(seconds=4.8) <= second.due_in <= timedelta(seconds=6)
    assert verdict(outcome, attempt=3) == AttemptVerdict(RunState.FAILED, 3)


def test_an_unreadable_definition_retries_after_the_fixed_delay() -> None:
    assert verdict(Outcome.FAILED, policy=None) == AttemptVerdict(P, 2, UNREADABLE_RETRY)
    assert verdict(Outcome.FAILED, attempt=3, policy=None) == AttemptVerdict(RunState.FAILED, 3)


def test_a_lost_lease_while_running_uses_an_attempt_and_is_due_at_once() -> None:
    assert verdict(Outcome.LEASE_EXPIRED, policy=None) == AttemptVerdict(P, 2, None)
    assert verdict(Outcome.LEASE_EXPIRED, attempt=3, policy=None) == AttemptVerdict(
        RunState.FAILED, 3
    )


def test_a_lost_lease_while_claimed_never_started_so_keeps_its_attempt() -> None:
    assert verdict(Outcome.LEASE_EXPIRED, state=C, attempt=3) == AttemptVerdict(P, 3, None)


def test_an_interrupted_run_is_pending_at_once_without_using_an_attempt() -> None:
    assert verdict(Outcome.INTERRUPTED, attempt=1, max_attempts=1) == AttemptVerdict(
        P, 1, timedelta(0)
    )


def test_the_state_machine_guards_the_decision() -> None:
    with pytest.raises(IllegalTransition, match="cannot go from pending to succeeded"):
        verdict(Outcome.SUCCEEDED, state=P)


@pytest.mark.parametrize("failed_attempt", [5, 6, 10, 64, 65, 1_000, 10**9])
def test_the_backoff_is_capped_at_its_maximum_however_many_attempts_failed(
    failed_attempt: int,
) -> None:
    # 2s x 3^4 = 162s is already past the 60s maximum; 3^64 x 2s does not fit
    # a timedelta at all (OverflowError) unless the cap comes first.
    assert POLICY.delay(failed_attempt) == POLICY.maximum
    keyed = POLICY.delay(failed_attempt, "run-1")
    assert POLICY.maximum * 0.8 <= keyed <= POLICY.maximum
    late = verdict(Outcome.FAILED, attempt=failed_attempt, max_attempts=failed_attempt + 1)
    assert late.due_in is not None
    assert late.due_in <= POLICY.maximum


def test_the_backoff_grows_below_the_cap() -> None:
    assert [POLICY.delay(n) for n in (1, 2, 3)] == [
        timedelta(seconds=2),
        timedelta(seconds=6),
        timedelta(seconds=18),
    ]

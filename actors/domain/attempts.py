"""What happens after an attempt: the one decision, for the worker, the reaper and the
unreadable path alike. The store applies the verdict; it decides nothing.

Changing the retry policy (when a run is retried, after how long, with which
backoff and jitter, when it fails for good) is a change to this module only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from actors.domain import defaults
from actors.domain.runs import Outcome, RunState, check_transition
from actors.domain.schedule import deterministic_offset

# A definition this build cannot read has no retry policy to follow: the
# attempt is retried (while attempts remain) after this fixed delay, in case a
# replica that reads it (a newer build, mid-deploy) takes it.
UNREADABLE_RETRY = timedelta(seconds=5)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff between failed attempts, capped."""

    initial: timedelta = defaults.RETRY_INITIAL
    maximum: timedelta = defaults.RETRY_MAXIMUM
    multiplier: float = defaults.RETRY_MULTIPLIER

    def delay(self, failed_attempt: int, key: str = "") -> timedelta:
        """Delay before the attempt after ``failed_attempt`` (1-based).

        Up to 20% is taken off, derived from ``key`` (the run id), so that runs
        failing together do not retry in lockstep, yet every replica computes
        the same delay for the same run.
        """
        exponent = min(max(0, failed_attempt - 1), 64)
        seconds = self.initial.total_seconds() * (self.multiplier**exponent)
        ceiling = timedelta(seconds=min(seconds, self.maximum.total_seconds()))
        if not key:
            return ceiling
        return ceiling - deterministic_offset(f"{key}#{failed_attempt}", ceiling / 5)


@dataclass(frozen=True)
class AttemptVerdict:
    """Where a run goes after an attempt ended (or a lease ran out)."""

    state: RunState  # succeeded, failed, or pending (to run again)
    attempt: int | None  # the run's attempt number afterwards; None: unchanged
    # Pending: due this long after the database's now(); None: due_at unchanged
    # (terminal, or a run due again at once that was already due).
    due_in: timedelta | None = None

    @classmethod
    def final(cls, outcome: Outcome) -> AttemptVerdict:
        """The result stands, no retry: succeeded, or failed for any other outcome."""
        return cls(RunState.SUCCEEDED if outcome is Outcome.SUCCEEDED else RunState.FAILED, None)

    @property
    def retry(self) -> bool:
        """Whether another attempt follows."""
        return self.state is RunState.PENDING


def decide_attempt(
    outcome: Outcome,
    *,
    state: RunState,
    attempt: int,
    max_attempts: int,
    policy: RetryPolicy | None,
    run_id: str,
) -> AttemptVerdict:
    """The verdict on attempt ``attempt`` of run ``run_id``, found in ``state``.

    - A lease that expired while the run was only claimed: it never started,
      so it goes back to pending with the same attempt.
    - Succeeded: done.
    - Interrupted (a clean shutdown ran out of grace): pending again at once,
      the attempt not used up (a deploy must not turn a max_attempts = 1 run
      into a failure).
    - Any other ending at the job's attempt limit: failed.
    - A lost worker (lease expired while running): the next attempt is due at
      once; the lease already waited out its length.
    - Otherwise the next attempt after the policy's backoff (with its
      deterministic jitter from the run id), or after UNREADABLE_RETRY when the
      policy could not be read (``policy`` None).

    The transition is checked against the state machine (IllegalTransition).
    """
    if state is RunState.CLAIMED:
        verdict = AttemptVerdict(RunState.PENDING, attempt)
    elif outcome is Outcome.SUCCEEDED:
        verdict = AttemptVerdict(RunState.SUCCEEDED, attempt)
    elif outcome is Outcome.INTERRUPTED:
        verdict = AttemptVerdict(RunState.PENDING, attempt, timedelta(0))
    elif attempt >= max_attempts:
        verdict = AttemptVerdict(RunState.FAILED, attempt)
    elif outcome is Outcome.LEASE_EXPIRED:
        verdict = AttemptVerdict(RunState.PENDING, attempt + 1)
    else:
        delay = UNREADABLE_RETRY if policy is None else policy.delay(attempt, run_id)
        verdict = AttemptVerdict(RunState.PENDING, attempt + 1, delay)
    check_transition(state, verdict.state)
    return verdict

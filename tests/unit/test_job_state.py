"""A job's state, decided once (actors/domain/job_state.py): each state and its order."""

from __future__ import annotations

from datetime import timedelta

import pytest

from actors.adapters.postgres.statements import CLUSTER_JOB_FIGURES, JOBS_OVERVIEW
from actors.adapters.postgres.statements.job_figures import LAST_OUTCOME, LAST_SUCCESS, backlog
from actors.domain.defaults import OVERDUE_AFTER
from actors.domain.job_state import JobFacts, JobState, is_overdue, job_state

LATE = OVERDUE_AFTER + timedelta(seconds=1)


def facts(**given: object) -> JobFacts:
    base: dict[str, object] = {
        "enabled": True,
        "paused": False,
        "last_state": "succeeded",
        "running": 0,
        "oldest_due_age": None,
        "rejected": False,
    }
    return JobFacts(**{**base, **given})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "state"),
    [
        ({}, JobState.HEALTHY),
        ({"last_state": None}, JobState.HEALTHY),  # never ran, nothing due yet
        ({"last_state": None, "running": 1}, JobState.RUNNING),  # its first run
        ({"running": 1}, JobState.HEALTHY),  # a later run: the last one was fine
        ({"last_state": "failed"}, JobState.FAILING),
        ({"last_state": "skipped"}, JobState.HEALTHY),
        ({"oldest_due_age": OVERDUE_AFTER}, JobState.HEALTHY),  # not older than the threshold
        ({"oldest_due_age": LATE}, JobState.OVERDUE),
        ({"last_state": None, "running": 1, "oldest_due_age": LATE}, JobState.OVERDUE),
        ({"rejected": True}, JobState.REJECTED),
        ({"rejected": True, "last_state": "failed"}, JobState.FAILING),
        ({"rejected": True, "oldest_due_age": LATE}, JobState.OVERDUE),
        ({"paused": True, "last_state": "failed", "oldest_due_age": LATE}, JobState.PAUSED),
        ({"enabled": False, "paused": True}, JobState.REMOVED),
    ],
)
def test_each_state_and_which_wins(given: dict[str, object], state: JobState) -> None:
    assert job_state(facts(**given)) is state


def test_overdue_means_a_backlog_older_than_the_named_threshold() -> None:
    assert not is_overdue(None)
    assert not is_overdue(OVERDUE_AFTER)
    assert is_overdue(LATE)
    assert is_overdue(timedelta(seconds=3), after=timedelta(seconds=2))


def test_the_listing_and_the_metrics_read_the_same_figures() -> None:
    """One SQL fragment each for the backlog, the last success and the last outcome."""
    for fragment in (LAST_SUCCESS, LAST_OUTCOME):
        assert fragment in JOBS_OVERVIEW
        assert fragment in CLUSTER_JOB_FIGURES
    assert backlog("$2") in JOBS_OVERVIEW
    assert backlog("$1") in CLUSTER_JOB_FIGURES

"""A job's state, decided once: what the API returns, the page shows, ``claimd jobs``
prints and ``claimd_job_state`` exposes.

One word per job, the first that holds, in this order: ``removed`` (no longer
in the config file), ``paused`` (an operator paused it), ``failing`` (its last
finished run failed), ``overdue`` (a run due more than
:data:`~actors.domain.defaults.OVERDUE_AFTER` ago has not started),
``rejected`` (the config file rejected its last edit; the old definition
keeps running), ``running`` (its first run is running and none has finished
yet), ``healthy`` (the last run was fine and nothing is overdue).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

from actors.domain.defaults import OVERDUE_AFTER


class JobState(enum.StrEnum):
    """What state a job is in, worst first (the page sorts by this order)."""

    FAILING = "failing"
    OVERDUE = "overdue"
    REJECTED = "rejected"
    PAUSED = "paused"
    REMOVED = "removed"
    RUNNING = "running"
    HEALTHY = "healthy"


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the state is decided from, as the store reads it (statements/job_figures.py)."""

    enabled: bool
    paused: bool
    last_state: str | None  # the state of its last finished run (None: none finished)
    running: int  # its runs running now
    oldest_due_age: timedelta | None  # how long its oldest backlog run has been due
    rejected: bool = False  # the config file rejected its last edit


def is_overdue(oldest_due_age: timedelta | None, after: timedelta = OVERDUE_AFTER) -> bool:
    """A backlog older than ``after``: the one meaning of "overdue"."""
    return oldest_due_age is not None and oldest_due_age > after


def job_state(facts: JobFacts, overdue_after: timedelta = OVERDUE_AFTER) -> JobState:
    """The job's state: the first of removed, paused, failing, overdue, rejected,
    running, healthy that holds."""
    if not facts.enabled:
        return JobState.REMOVED
    if facts.paused:
        return JobState.PAUSED
    if facts.last_state == "failed":
        return JobState.FAILING
    if is_overdue(facts.oldest_due_age, overdue_after):
        return JobState.OVERDUE
    if facts.rejected:
        return JobState.REJECTED
    if facts.last_state is None and facts.running > 0:
        return JobState.RUNNING
    return JobState.HEALTHY

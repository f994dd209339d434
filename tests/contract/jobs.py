"""Jobs and messages the contract tests share."""

from __future__ import annotations

from datetime import timedelta

from actors.domain import Catchup, ClaimedRun, CronSchedule, Job, Overlap, PythonSpec
from actors.ports import DispatchMessage

# Never fires inside a test: the tests insert the runs they want.
RARE_CRON = "0 0 1 1 *"
LEASE = timedelta(minutes=5)


def job(
    name: str = "job",
    *,
    max_attempts: int = 3,
    overlap: Overlap = Overlap.ALLOW,
    catchup: Catchup = Catchup.ALL,
    starting_deadline: timedelta | None = None,
    cron: str = RARE_CRON,
) -> Job:
    return Job(
        name=name,
        schedule=CronSchedule(cron, "UTC"),
        executor=PythonSpec("tests.integration.helpers:record_call"),
        max_attempts=max_attempts,
        overlap=overlap,
        catchup=catchup,
        starting_deadline=starting_deadline,
    )


def message(run: ClaimedRun) -> DispatchMessage:
    return DispatchMessage(run.run_id, run.epoch, run.job, run.scheduled_at, run.attempt, "d")


def ago(seconds: float) -> timedelta:
    return -timedelta(seconds=seconds)

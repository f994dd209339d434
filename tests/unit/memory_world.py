"""A small world of in-memory ports for the actors' unit tests: jobs, a store, a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from actors.domain import Catchup, IntervalSchedule, Job, Overlap, PythonSpec, RetryPolicy
from actors.testing.memory import InMemoryBroker, InMemoryRunStore, ManualClock

LEASE = timedelta(seconds=30)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def job(
    name: str = "beat",
    *,
    every: timedelta = timedelta(minutes=1),
    max_attempts: int = 3,
    overlap: Overlap = Overlap.ALLOW,
    catchup: Catchup = Catchup.ALL,
    starting_deadline: timedelta | None = None,
    retry: RetryPolicy | None = None,
) -> Job:
    return Job(
        name=name,
        schedule=IntervalSchedule(every=every),
        executor=PythonSpec("tests.unit.jobfuncs:sync_job"),
        max_attempts=max_attempts,
        overlap=overlap,
        catchup=catchup,
        starting_deadline=starting_deadline,
        retry=retry or RetryPolicy(initial=timedelta(seconds=10)),
    )


async def world(*jobs: Job) -> tuple[ManualClock, InMemoryRunStore, InMemoryBroker]:
    """A clock, a store holding ``jobs`` (synced, as the replica does at start), a broker."""
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    await store.sync_jobs(list(jobs) or [job()])
    return clock, store, InMemoryBroker()


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``check`` until it holds (a deadline, never a sleep that orders events)."""
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0)
    except TimeoutError:
        raise AssertionError(f"not within {timeout}s: {what}") from None

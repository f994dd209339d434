"""Cluster-wide gauges, read from the database when /metrics is scraped.

Counters are per replica (each counts what it did; Prometheus sums them).
What an operator alerts on about the whole deployment (a job's last success,
runs overdue and not started, leases nobody recovered) is not something any
replica counts: it is read from the database, the truth, so every replica
reports the same value (aggregate with ``max``, never ``sum``), and a job
nothing ever started is still seen.

The read is one pair of indexed queries, at most once per ``min_interval``
(two scrapes in the same second share one read), bounded by ``timeout``: a
scrape while the database is away or frozen answers at once with the last
figures, and ``claimd_cluster_metrics_age_seconds`` says how old they are.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta

from actors import clocks
from actors.clocks import utc_now
from actors.domain import decode_job, take
from actors.domain.job_state import JobFacts, job_state
from actors.observability import (
    CLUSTER,
    ClusterCollector,
    ClusterSnapshot,
    JobSnapshot,
    get_logger,
    redact,
)
from actors.ports import ClusterReading, JobReading

log = get_logger("metrics")

ReadFigures = Callable[[float], Awaitable[ClusterReading]]

# The period is the longest gap among this many upcoming instants.
PERIOD_SAMPLES = 11
WARN_EVERY_S = 60.0


def schedule_period(definition: str, now: datetime) -> float | None:
    """Seconds between a job's instants: the longest gap among its next ten.

    The longest, so that "no success for N periods" never fires across a gap
    the schedule itself has (a weekday cron's weekend). None when unreadable
    or when the schedule has fewer than two instants in the next ten years.
    """
    try:
        schedule = decode_job("", definition).schedule
    except (KeyError, ValueError, TypeError):
        return None
    instants = take(schedule.fire_times(now, now + timedelta(days=3660)), PERIOD_SAMPLES)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(instants)]
    return max(gaps) if gaps else None


@dataclass(eq=False)
class ClusterMetrics:
    """Refreshes the cluster gauges' snapshot; ``read`` is set once the store connects."""

    read: ReadFigures | None = None
    _: KW_ONLY
    collector: ClusterCollector = CLUSTER
    min_interval: float = 1.0
    timeout: float = 2.0
    monotonic: Callable[[], float] = clocks.monotonic
    _attempted: float | None = field(default=None, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    # A job's schedule period (seconds) by its definition's fingerprint.
    _periods: dict[str, float | None] = field(default_factory=dict, init=False)
    _warned: float | None = field(default=None, init=False)

    async def refresh(self) -> None:
        """Read the figures unless they were read (or tried) within ``min_interval``."""
        if self.read is None:
            return
        async with self._lock:
            now = self.monotonic()
            if self._attempted is not None and now - self._attempted < self.min_interval:
                return
            self._attempted = now
            try:
                reading = await asyncio.wait_for(self.read(self.timeout), self.timeout)
            except Exception as exc:  # noqa: BLE001 - /metrics answers anyway, figures aged
                if self._warned is None or now - self._warned >= WARN_EVERY_S:
                    self._warned = now
                    log.warning(
                        "cluster metrics not read; reporting the last figures",
                        error=redact(repr(exc))[:300],
                    )
                return
            self.collector.update(self.snapshot(reading))

    def snapshot(self, reading: ClusterReading) -> ClusterSnapshot:
        return ClusterSnapshot(
            jobs=tuple(self._job(j) for j in reading.jobs),
            claimed=reading.claimed,
            running=reading.running,
            past_lease=reading.past_lease,
        )

    def _job(self, job: JobReading) -> JobSnapshot:
        if job.fingerprint not in self._periods and job.definition is not None:
            self._periods[job.fingerprint] = schedule_period(job.definition, utc_now())
        return JobSnapshot(
            name=job.name,
            paused=job.paused,
            last_success=None if job.last_success is None else job.last_success.timestamp(),
            last_failure=None if job.last_failure is None else job.last_failure.timestamp(),
            overdue=job.overdue,
            overdue_oldest_age=job.overdue_oldest_age,
            period=self._periods.get(job.fingerprint),
            materialized_behind=job.materialized_behind,
            state=job_state(
                JobFacts(
                    enabled=True,  # the reading holds the jobs in the config file
                    paused=job.paused,
                    last_state=job.last_state,
                    running=job.running,
                    oldest_due_age=timedelta(seconds=job.overdue_oldest_age),
                    rejected=job.rejected,
                )
            ).value,
        )

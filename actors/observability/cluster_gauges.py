"""Cluster-wide gauges: read from the database, the same on every replica."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from actors.domain.job_state import JobState
from actors.observability.exposition import (
    BATCH,
    RUN,
    escape,
    help_and_type,
    number,
    rendering,
    stale_runs,
    writes_own_text,
)
from actors.observability.metrics import JOB_LABEL

# --- cluster-wide gauges: read from the database, the same on every replica ------------

CLUSTER_NOTE = (
    "scope=cluster: read from the database, every replica reports the same "
    "value; aggregate with max(), never sum()"
)


@dataclass(frozen=True, slots=True)  # one per job, kept between scrapes
class JobSnapshot:
    """One job's cluster-wide figures, as the database says."""

    name: str
    paused: bool
    last_success: float | None  # seconds since the epoch
    last_failure: float | None
    overdue: int
    overdue_oldest_age: float  # seconds; 0 when nothing is overdue
    period: float | None  # seconds; None when the definition could not be read
    materialized_behind: float  # seconds the job's rows stop short of now; 0 when ahead
    state: str = "healthy"  # actors.domain.job_state, decided by the reader


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the cluster gauges report, read in one pass."""

    jobs: tuple[JobSnapshot, ...] = ()
    claimed: int = 0
    running: int = 0
    past_lease: int = 0


# The per-job gauges: name, help, and the job's value (None: no sample).
PER_JOB: tuple[tuple[str, str, Callable[[JobSnapshot], float | None]], ...] = (
    (
        "claimd_job_last_success_timestamp_seconds",
        "When the job's last successful run finished (seconds since the "
        "epoch; absent: never, within the history kept)",
        lambda j: j.last_success,
    ),
    (
        "claimd_job_last_failure_timestamp_seconds",
        "When the job's last run that failed for good (failed or timed out, "
        "no attempt left) finished (seconds since the epoch)",
        lambda j: j.last_failure,
    ),
    (
        "claimd_job_overdue_runs",
        "The job's runs due more than OVERDUE_AFTER (10 s) ago and not yet started "
        "(0 while it is paused)",
        lambda j: j.overdue,
    ),
    (
        "claimd_job_overdue_oldest_age_seconds",
        "How long the job's oldest run due and not started has been due",
        lambda j: j.overdue_oldest_age,
    ),
    (
        "claimd_job_period_seconds",
        "The job's schedule period: the longest gap between its next ten "
        "instants (a weekday cron reports its weekend gap)",
        lambda j: j.period,
    ),
    (
        "claimd_job_paused",
        "1 while an operator has the job paused",
        lambda j: 1.0 if j.paused else 0.0,
    ),
    (
        "claimd_job_materialized_behind_seconds",
        "How far the job's materialized rows stop short of now (0: planned "
        "ahead; lasting: no materializer runs and due instants have no row)",
        lambda j: j.materialized_behind,
    ),
)


# claimd_job_state{claimd_job, state}: 1 for the job's state, 0 for the others (the
# states a job in the config file can be in: removed jobs are not reported).
JOB_STATE = "claimd_job_state"
JOB_STATE_HELP = (
    "1 for the job's state (running, healthy, failing, overdue, paused, rejected), 0 for "
    "the others: the state the API, the page and `claimd jobs` show"
)
JOB_STATES = tuple(s.value for s in JobState if s is not JobState.REMOVED)


@dataclass(eq=False)  # hashable by identity: the registry keys collectors
class ClusterCollector(Collector):
    """Yields the cluster gauges from the last snapshot read (see actors/replica/cluster_reader.py).

    Nothing here talks to the database: the /metrics handler refreshes the
    snapshot (one query set, rate-limited, with a deadline) before rendering.
    Until the first read succeeds only the age gauge is reported (+Inf).
    """

    snapshot: ClusterSnapshot | None = None
    read_at: float | None = None  # time.monotonic() of the read
    monotonic: Any = field(default=time.monotonic)
    # As the last scrape wrote them: the jobs, and by run of RUN jobs their lines of
    # each per-job family (PER_JOB's order, then the states).
    _written: tuple[tuple[JobSnapshot, ...], list[tuple[str, ...]]] = field(
        default_factory=lambda: ((), []), init=False, repr=False
    )

    def update(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.read_at = self.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        age = float("inf") if self.read_at is None else self.monotonic() - self.read_at
        yield GaugeMetricFamily(
            "claimd_cluster_metrics_age_seconds",
            "Seconds since this replica last read the cluster-wide gauges from the database "
            "(+Inf: never; they are read on scrape, at most once a second)",
            value=age,
        )
        snap = self.snapshot
        if snap is None:
            return
        if not rendering():  # /metrics: the per-job gauges are written by text()
            yield from self._per_job(snap)
        overdue = [j for j in snap.jobs if j.overdue]
        yield GaugeMetricFamily(
            "claimd_overdue_runs",
            "Runs due and not yet started (pending or claimed), of enabled unpaused jobs; "
            + CLUSTER_NOTE,
            value=sum(j.overdue for j in overdue),
        )
        yield GaugeMetricFamily(
            "claimd_overdue_oldest_age_seconds",
            "How long the oldest run due and not started has been due (0: none); " + CLUSTER_NOTE,
            value=max((j.overdue_oldest_age for j in overdue), default=0.0),
        )
        in_flight = GaugeMetricFamily(
            "claimd_runs_in_flight",
            "Runs holding a lease, by state (claimed: on their way to a worker; running); "
            + CLUSTER_NOTE,
            labels=["state"],
        )
        in_flight.add_metric(["claimed"], snap.claimed)
        in_flight.add_metric(["running"], snap.running)
        yield in_flight
        yield GaugeMetricFamily(
            "claimd_runs_past_lease",
            "Claimed or running runs whose lease has expired and that no reaper has "
            "recovered yet (lasting: no reaper runs, runs are being lost); " + CLUSTER_NOTE,
            value=snap.past_lease,
        )

    @staticmethod
    def _per_job(snap: ClusterSnapshot) -> Iterator[GaugeMetricFamily]:
        for name, text, value in PER_JOB:
            family = GaugeMetricFamily(name, f"{text}; {CLUSTER_NOTE}", labels=[JOB_LABEL])
            for job in snap.jobs:
                if (v := value(job)) is not None:
                    family.add_metric([job.name], v)
            yield family
        states = GaugeMetricFamily(
            JOB_STATE, f"{JOB_STATE_HELP}; {CLUSTER_NOTE}", labels=[JOB_LABEL, "state"]
        )
        for job in snap.jobs:
            for state in JOB_STATES:
                states.add_metric([job.name, state], 1.0 if job.state == state else 0.0)
        yield states

    def text(self) -> Iterator[str]:
        """The per-job gauges' /metrics text (see actors.observability.exposition).

        Each refresh brings a new JobSnapshot for every job, mostly equal to the
        last: a run of RUN jobs' lines is written again only when one of their
        snapshots differs from the last scrape's (writing every line took 0.7 s
        of CPU a scrape at 100,000 jobs). Only the last scrape's runs are kept.
        One difference equality does not see: a figure going from 0.0 to -0.0
        (or back), nothing else of its run changed, keeps its "0.0" ("-0.0")
        line; the database's figures are numeric cast to float8, never -0.0.
        """
        return self._text(reuse=True)

    def fresh_text(self) -> Iterator[str]:
        """The same text, every line written afresh (the reference for the text kept)."""
        return self._text(reuse=False)

    def _text(self, reuse: bool) -> Iterator[str]:
        snap = self.snapshot
        if snap is None:
            return
        jobs = snap.jobs
        then_jobs, then = self._written if reuse else ((), [])
        stale = stale_runs(jobs, then_jobs, operator.ne)  # JobSnapshot's ==: every field
        runs = [
            _run_lines(jobs[start : start + RUN]) if n in stale else then[n]
            for n, start in enumerate(range(0, len(jobs), RUN))
        ]
        if reuse:
            self._written = (jobs, runs)
        families = [(name, f"{text}; {CLUSTER_NOTE}") for name, text, _ in PER_JOB]
        families.append((JOB_STATE, f"{JOB_STATE_HELP}; {CLUSTER_NOTE}"))
        for column, (name, documentation) in enumerate(families):
            yield help_and_type(name, documentation, "gauge")
            for start in range(0, len(runs), BATCH // RUN):
                yield "".join([lines[column] for lines in runs[start : start + BATCH // RUN]])

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # names vary with the snapshot; registered without checks


# A job's lines of claimd_job_state, by its state: the parts its label joins.
_STATE_PARTS: dict[str, tuple[str, ...]] = {}


def _state_parts(state: str) -> tuple[str, ...]:
    """The six lines of a job in ``state`` but its label: ``label.join(parts)`` writes
    them in one call, where an f-string a line was most of this family's time."""
    parts = _STATE_PARTS.get(state)
    if parts is None:
        ends = [f'",state="{s}"}} {"1.0" if state == s else "0.0"}\n' for s in JOB_STATES]
        head = f'{JOB_STATE}{{{JOB_LABEL}="'
        parts = (head, *(end + head for end in ends[:-1]), ends[-1])
        if len(_STATE_PARTS) < 64:  # the states there are; anything else written afresh
            _STATE_PARTS[state] = parts
    return parts


def _run_lines(jobs: tuple[JobSnapshot, ...]) -> tuple[str, ...]:
    """These jobs' lines of each per-job family (PER_JOB's order, then the states)."""
    labels = [escape(job.name) for job in jobs]
    families = []
    for name, _, value in PER_JOB:
        head = f'{name}{{{JOB_LABEL}="'
        families.append(
            "".join(
                f'{head}{label}"}} {number(v)}\n'
                for job, label in zip(jobs, labels, strict=True)
                if (v := value(job)) is not None
            )
        )
    families.append(
        "".join(
            label.join(_state_parts(job.state)) for job, label in zip(jobs, labels, strict=True)
        )
    )
    return tuple(families)


CLUSTER = ClusterCollector()
REGISTRY.register(CLUSTER)
writes_own_text(CLUSTER)

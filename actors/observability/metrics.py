"""Prometheus metrics: every series this replica exports (the dependency gauges in dependencies.py).

Metric names count duplicates; they never claim there are none.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib import metadata
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info

from actors.domain import Outcome
from actors.observability.dependencies import init_dependency_series
from actors.observability.exposition import writes_own_text
from actors.observability.per_job_metrics import JobCounter, JobHistogram

# --- metrics -------------------------------------------------------------------

JOB_LABEL = "claimd_job"


_PerJob = TypeVar("_PerJob", JobCounter, JobHistogram)


def _per_job(collector: _PerJob) -> _PerJob:
    """Registered like prometheus_client's own metrics (the default registry); its
    /metrics text written by itself (actors.observability.exposition)."""
    REGISTRY.register(collector)
    writes_own_text(collector)
    return collector


RUNS_MATERIALIZED = Counter(
    "claimd_runs_materialized_total", "Runs inserted by the materializer (duplicates excluded)"
)
PLANS_DISCARDED = Counter(
    "claimd_plans_discarded_total",
    "Parts of a materializer plan not written because they reached the database later than "
    "their on-time tolerance (planned again at once from a fresh clock)",
)
PLANNING_BEHIND = Gauge(
    "claimd_materializer_behind_seconds",
    "How long the oldest job due for planning on this replica has waited past its time "
    "(0 while the materializer keeps up; past horizon / 2 instants risk being planned late)",
)
PLANNING_JOBS = Gauge(
    "claimd_materializer_jobs", "Jobs this replica's materializer keeps a plan for"
)
# Per-job series (created for every job at start: init_job_series) are kept
# compact (actors.observability.per_job_metrics): 10,000 jobs would otherwise hold
# 150 MB of prometheus_client objects.
RUNS_MISSED = _per_job(
    JobCounter(
        "claimd_runs_missed_total", "Past instants dropped by a job's catch-up policy", [JOB_LABEL]
    )
)
RUNS_SKIPPED = Counter(
    "claimd_runs_skipped_total", "Due runs recorded skipped by policy (deadline, overlap, catch-up)"
)
RUNS_CLAIMED = Counter("claimd_runs_claimed_total", "Runs claimed by this replica")
PUBLISHED = Counter("claimd_dispatch_published_total", "Dispatch messages acked by JetStream")
PUBLISH_FAILED = Counter(
    "claimd_dispatch_publish_failed_total",
    "Dispatch publishes that failed and went to the compensator",
)
RUNS_RELEASED = Counter(
    "claimd_runs_released_total", "Unpublished runs the compensator returned to pending"
)
RUNS_REAPED = Counter("claimd_runs_reaped_total", "Runs whose lease expired", ["transition"])
RUNS_PRUNED = Counter("claimd_runs_pruned_total", "Terminal runs deleted by history retention")
RUNS_STARTED = _per_job(
    JobCounter("claimd_runs_started_total", "Runs a worker moved to running", [JOB_LABEL])
)
RUNS_COMPLETED = _per_job(
    JobCounter(
        "claimd_runs_completed_total",
        "Attempts recorded, by outcome (a retried failure counts each attempt)",
        [JOB_LABEL, "outcome"],
    )
)
RUNS_FAILED_FINALLY = _per_job(
    JobCounter(
        "claimd_runs_failed_total",
        "Runs this replica recorded failed for good: a failed or timed-out last attempt "
        "(worker), or a lease that expired on the last attempt (reaper)",
        [JOB_LABEL],
    )
)
DELIVERIES_SKIPPED = Counter(
    "claimd_deliveries_skipped_total",
    "Deliveries that changed nothing (run terminal, owned elsewhere, stale epoch, unknown)",
    ["reason"],
)
REDELIVERIES = Counter("claimd_redeliveries_total", "Messages JetStream delivered more than once")
# Why the HTTP face turned a client away (actors/http/guard.py).
HTTP_REFUSAL_REASONS = ("connection_cap", "host", "token", "scope", "output_streams")
HTTP_REFUSED = Counter(
    "claimd_http_refused_total",
    "HTTP connections closed by the connection cap, and requests refused for their Host "
    "(421), a missing or wrong token (401), a token's scope (403) or a full set of run "
    "output streams (503)",
    ["reason"],
)
# Live output (actors/adapters/live_output.py, actors/http/api/live.py).
LIVE_OUTPUT_DROPPED = Counter(
    "claimd_live_output_dropped_bytes_total",
    "Bytes runs printed that were not relayed live (past the per-run rate); the tail kept "
    "with each attempt is unaffected",
)
OUTPUT_STREAMS = Gauge(
    "claimd_http_output_streams", "Run output streams (Server-Sent Events) open on this replica"
)
FENCED_COMPLETIONS = Counter(
    "claimd_fenced_completions_total",
    "Completions refused because the run's epoch moved on (a duplicate execution)",
)
POISON_MESSAGES = Counter(
    "claimd_poison_messages_total",
    "Messages on the dispatch subject that were not valid dispatches",
    ["reason"],
)
COMPLETIONS_REJECTED = Counter(
    "claimd_completions_rejected_total",
    "Completions not recorded for a reason other than an outage (refused, or an error); "
    "left to the lease and the reaper",
)
LEASES_LOST = Counter(
    "claimd_leases_lost_total",
    "Running runs whose lease extension was refused (reaped or cancelled)",
)
ACTOR_OUTAGES = Counter(
    "claimd_actor_outages_total", "Actor restarts because a server was unavailable", ["actor"]
)
ACTOR_RESTARTS = Counter("claimd_actor_restarts_total", "Actor crashes restarted", ["actor"])
CONFIG_JOB_ERRORS = Gauge("claimd_config_job_errors", "Jobs in the config file that are invalid")
CONFIG_JOB_REJECTED = Gauge(
    "claimd_config_job_rejected",
    "1 for each job the config file declares and this replica refused at its last load "
    "(start or reload); a rejected edit of a running job leaves its old definition running",
    [JOB_LABEL],
)
# The rollout rule (docs/rollout.md): what this replica's file is, what is in
# force, and (from the database) how many file digests the replicas report.
CONFIG_FILE_REFUSED = Gauge(
    "claimd_config_file_refused",
    "1 while the config file this replica last read is refused as a whole (not TOML, a bad "
    "[claimd] table): it runs the jobs of its last good load",
)
CONFIG_STALE = Gauge(
    "claimd_config_stale",
    "1 while this replica's config file is refused as older than the generation in force "
    "(it runs the jobs in force; `claimd reload --force` rolls back)",
)
CONFIG_FILE_INFO = Gauge(
    "claimd_config_file_info",
    "1 for the digest of this replica's config file (its jobs; first 12 hex characters)",
    ["digest"],
)
CONFIG_IN_FORCE_INFO = Gauge(
    "claimd_config_in_force_info",
    "1 for the digest of the config generation in force, as this replica last read it",
    ["digest"],
)
CONFIG_DIGESTS = Gauge(
    "claimd_config_digests",
    "Distinct config file digests among the replicas reporting now (cluster-wide, from the "
    "database); above 1 the replicas disagree",
)
RUNS_IN_FLIGHT = Gauge("claimd_worker_runs_in_flight", "Runs executing on this worker")
CLOCK_SKEW = Gauge(
    "claimd_clock_skew_seconds",
    "This replica's wall clock minus the database's (positive: ahead), "
    "corrected for half the round trip; claimd decides on the database's clock",
)
# Milliseconds to minutes: a healthy start is tens of ms late, a stalled one minutes.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
SCHEDULE_LAG = _per_job(
    JobHistogram(
        "claimd_start_lag_seconds",
        "Start time minus due time (the scheduled instant plus jitter, or the retry time), on "
        "the database's clock; scheduled runs only (manual triggers and backfills are meant "
        "to start late and are not observed)",
        [JOB_LABEL],
        buckets=LAG_BUCKETS,
    )
)
ARRIVED_AHEAD = Histogram(
    "claimd_run_arrival_ahead_seconds",
    "How long before its due time a run reached its worker (held until then); 0 when it "
    "arrived due already: claim_ahead shorter than claim + publish + fetch takes",
    buckets=(0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0),
)
RUN_DURATION = _per_job(
    JobHistogram(
        "claimd_run_duration_seconds",
        "Execution time of attempts",
        [JOB_LABEL],
        buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800, 3600),
    )
)
# Async python jobs run on job event loops of their own (not the worker's): a
# job that blocks one (time.sleep in an async def) delays only the jobs on that
# loop, and this says which job did, for how long.
JOB_LOOP_BLOCKED = Counter(
    "claimd_job_loop_blocked_seconds_total",
    "Seconds a job event loop was held by one async python job without yielding "
    "(counted once a stall passes the watchdog's threshold)",
    [JOB_LABEL],
)
PYTHON_CHILDREN_STARTED = Counter(
    "claimd_python_children_started_total",
    "Processes forked for sync python job executions by this replica's fork server",
)
# Intake: the worker stops fetching while it cannot keep its leases or record
# its completions (or the broker does not answer), the claimer stops claiming
# while this replica cannot publish; the work goes to the other replicas.
INTAKE_PAUSED = Gauge(
    "claimd_intake_paused", "1 while this actor takes in no new work it could not keep", ["actor"]
)
INTAKE_PAUSES = Counter(
    "claimd_intake_pauses_total",
    "Times an actor stopped taking in new work, by why",
    ["actor", "reason"],
)


BUILD_INFO = Info("claimd_build", "The claimd build this replica runs (value 1)")


# --- every series from the start ----------------------------------------------------------

# The label values each labelled counter can take, created at zero at start.
DELIVERY_SKIP_REASONS = (
    "terminal",
    "owned",
    "stale",
    "unknown",
    "unreadable",
    "skipped",
    "executing_here",
    "starting_here",
    "abandoned_here",
)
POISON_REASONS = ("oversized", "not_json", "wrong_schema", "other_deployment", "invalid")
REAP_TRANSITIONS = ("claimed->pending", "running->pending", "running->failed")
ACTORS = (
    "materializer",
    "claimer",
    "dispatcher",
    "compensator",
    "reaper",
    "worker",
    "clock",
    "notifier",
)
# Why an actor stops taking in work (actors/worker/heartbeat.py names the worker's sources).
INTAKE_REASONS = {
    "worker": ("heartbeat", "completions", "starts", "broker"),
    "claimer": ("broker",),
}


def claimd_version() -> str:
    try:
        return metadata.version("claimd")
    except metadata.PackageNotFoundError:  # running from a tree that was never installed
        return "unknown"


def init_series() -> None:
    """Create the labelled series that do not depend on the jobs, at zero; build info."""
    BUILD_INFO.info(
        {"version": claimd_version(), "python": ".".join(str(n) for n in sys.version_info[:3])}
    )
    for reason in DELIVERY_SKIP_REASONS:
        DELIVERIES_SKIPPED.labels(reason=reason)
    for reason in POISON_REASONS:
        POISON_MESSAGES.labels(reason=reason)
    for reason in HTTP_REFUSAL_REASONS:
        HTTP_REFUSED.labels(reason=reason)
    for transition in REAP_TRANSITIONS:
        RUNS_REAPED.labels(transition=transition)
    for actor in ACTORS:
        ACTOR_RESTARTS.labels(actor=actor)
        ACTOR_OUTAGES.labels(actor=actor)
    init_dependency_series()
    for actor, reasons in INTAKE_REASONS.items():
        INTAKE_PAUSED.labels(actor=actor)
        for reason in reasons:
            INTAKE_PAUSES.labels(actor=actor, reason=reason)


def per_job_histograms(on: bool) -> None:
    """The run histograms by job (the default), or one series each for all jobs (at start)."""
    for histogram in (SCHEDULE_LAG, RUN_DURATION):
        histogram.aggregate(not on)


def init_job_series(jobs: Iterable[str]) -> None:
    """Create every per-job series of these jobs at zero (at start, and for added jobs)."""
    for job in jobs:
        RUNS_MISSED.labels(job)
        RUNS_STARTED.labels(job)
        RUNS_FAILED_FINALLY.labels(job)
        for outcome in Outcome:
            RUNS_COMPLETED.labels(job, outcome.value)
        SCHEDULE_LAG.labels(job)
        RUN_DURATION.labels(job)

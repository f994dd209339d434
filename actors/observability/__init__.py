"""Logs (structlog, JSON, with run_id and job) and Prometheus metrics.

Metric names count duplicates; they never claim there are none.

Metric conventions: the ``claimd_`` prefix, base units (seconds, timestamps in
seconds since the epoch), ``_total`` on counters, and the per-job label
``claimd_job``: a label called ``job`` would collide with the target label
Prometheus attaches to every scrape and be renamed ``exported_job``.
Every labelled series a replica knows of is created at zero when it starts
(:func:`init_series`, :func:`init_job_series`), so a rate or an alert has a
series to work on before the first event.

The rooms: ``logs`` (structlog and redaction), ``metrics`` (the series and
the dependency gauges), ``cluster`` (the cluster-wide gauges' collector).
"""

from actors.observability.cluster import (
    CLUSTER,
    CLUSTER_NOTE,
    ClusterCollector,
    ClusterSnapshot,
    JobSnapshot,
)
from actors.observability.logs import (
    LOG_FORMATS,
    configure_logging,
    get_logger,
    redact,
    resolve_log_format,
)
from actors.observability.metrics import (
    ACTOR_OUTAGES,
    ACTOR_RESTARTS,
    ACTORS,
    BUILD_INFO,
    CLOCK_SKEW,
    COMPLETIONS_REJECTED,
    CONFIG_JOB_ERRORS,
    DELIVERIES_SKIPPED,
    DELIVERY_SKIP_REASONS,
    DEPENDENCIES,
    DEPENDENCY_UP,
    FENCED_COMPLETIONS,
    INTAKE_PAUSED,
    INTAKE_PAUSES,
    INTAKE_REASONS,
    JOB_LABEL,
    LAG_BUCKETS,
    LEASES_LOST,
    POISON_MESSAGES,
    POISON_REASONS,
    PUBLISH_FAILED,
    PUBLISHED,
    REAP_TRANSITIONS,
    RECONNECTS,
    REDELIVERIES,
    RUN_DURATION,
    RUNS_CLAIMED,
    RUNS_COMPLETED,
    RUNS_FAILED_FINALLY,
    RUNS_IN_FLIGHT,
    RUNS_MATERIALIZED,
    RUNS_MISSED,
    RUNS_PRUNED,
    RUNS_REAPED,
    RUNS_RELEASED,
    RUNS_SKIPPED,
    RUNS_STARTED,
    SCHEDULE_LAG,
    DependencyHealth,
    claimd_version,
    init_job_series,
    init_series,
)

__all__ = [
    "ACTORS",
    "ACTOR_OUTAGES",
    "ACTOR_RESTARTS",
    "BUILD_INFO",
    "CLOCK_SKEW",
    "CLUSTER",
    "CLUSTER_NOTE",
    "COMPLETIONS_REJECTED",
    "CONFIG_JOB_ERRORS",
    "DELIVERIES_SKIPPED",
    "DELIVERY_SKIP_REASONS",
    "DEPENDENCIES",
    "DEPENDENCY_UP",
    "FENCED_COMPLETIONS",
    "INTAKE_PAUSED",
    "INTAKE_PAUSES",
    "INTAKE_REASONS",
    "JOB_LABEL",
    "LAG_BUCKETS",
    "LEASES_LOST",
    "LOG_FORMATS",
    "POISON_MESSAGES",
    "POISON_REASONS",
    "PUBLISHED",
    "PUBLISH_FAILED",
    "REAP_TRANSITIONS",
    "RECONNECTS",
    "REDELIVERIES",
    "RUNS_CLAIMED",
    "RUNS_COMPLETED",
    "RUNS_FAILED_FINALLY",
    "RUNS_IN_FLIGHT",
    "RUNS_MATERIALIZED",
    "RUNS_MISSED",
    "RUNS_PRUNED",
    "RUNS_REAPED",
    "RUNS_RELEASED",
    "RUNS_SKIPPED",
    "RUNS_STARTED",
    "RUN_DURATION",
    "SCHEDULE_LAG",
    "ClusterCollector",
    "ClusterSnapshot",
    "DependencyHealth",
    "JobSnapshot",
    "claimd_version",
    "configure_logging",
    "get_logger",
    "init_job_series",
    "init_series",
    "redact",
    "resolve_log_format",
]

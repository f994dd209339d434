"""Logs (structlog, JSON, with run_id and job) and Prometheus metrics.

Metric names count duplicates; they never claim there are none.

Metric conventions: the ``claimd_`` prefix, base units (seconds, timestamps in
seconds since the epoch), ``_total`` on counters, and the per-job label
``claimd_job``: a label called ``job`` would collide with the target label
Prometheus attaches to every scrape and be renamed ``exported_job``.
Every labelled series a replica knows of is created at zero when it starts
(:func:`init_series`, :func:`init_job_series`), so a rate or an alert has a
series to work on before the first event.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

import structlog
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from actors.domain import Outcome

# --- redaction -----------------------------------------------------------------

# scheme://user:password@host (any scheme: postgresql, nats, tls, http...).
_PASSWORD_IN_URL = re.compile(
    r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s,]*):(?P<pw>[^@/\s]+)@", re.I
)
# nats://token@host: NATS's token form; the whole user part is the secret. Only
# for NATS's schemes: in postgresql://user@host the user name is not a secret.
_TOKEN_IN_NATS_URL = re.compile(r"(?P<scheme>\b(?:nats|tls|ws|wss)://)(?P<token>[^:/@\s,]+)@", re.I)
# ?password=..., &token=..., and key-value DSNs (password=secret or password='s e')
_SECRET_KEYS = (
    r"password|passwd|pwd|sslpassword|pass|token|auth_token|access_token|"
    r"api_key|apikey|api_token|secret|client_secret|sslkey_password|nkey|jwt"
)
_SECRET_PARAM = re.compile(
    rf"(?P<key>\b(?:{_SECRET_KEYS}))(?P<eq>\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,'\"]+)",
    re.I,
)
_BEARER = re.compile(r"(?P<scheme>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{6,}", re.I)


def redact(text: str) -> str:
    """Remove credentials from URLs, DSNs and headers in ``text``.

    ``postgresql://u:secret@h`` -> ``postgresql://u:***@h``; ``nats://tok@h`` ->
    ``nats://***@h``; ``?password=x`` / ``&token=x`` / ``password='x y'`` (a
    key-value DSN) -> ``password=***``; ``Bearer abc...`` -> ``Bearer ***``.
    """
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    text = _TOKEN_IN_NATS_URL.sub(
        lambda m: m[0] if m["token"] == "***" else f"{m['scheme']}***@", text
    )
    text = _SECRET_PARAM.sub(lambda m: f"{m['key']}{m['eq']}***", text)
    return _BEARER.sub(lambda m: f"{m['scheme']}***", text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
    return event


# --- logs ----------------------------------------------------------------------

LOG_FORMATS = ("auto", "json", "console")


def resolve_log_format(log_format: str, stream: Any = None) -> str:
    """``auto`` is ``console`` when ``stream`` (stderr) is a terminal, else ``json``."""
    if log_format != "auto":
        return log_format
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure_logging(level: str = "INFO", log_format: str = "json") -> None:
    """One event per line on stderr, ours and the libraries' alike.

    asyncio, aiohttp, asyncpg and nats-py log through the standard library
    (nats-py its reconnect errors, with tracebacks): the root logger's handler
    renders those records through the same processors as structlog's own
    events (structlog's ProcessorFormatter), so a library's traceback is one
    ``exception`` field of one JSON line, never raw lines. ``log_format`` is
    ``json``, ``console`` (human-readable) or ``auto`` (console on a terminal).
    """
    json_logs = resolve_log_format(log_format) == "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _redact_processor,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn() as log records too, not raw stderr
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            _redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(actor: str) -> Any:
    return structlog.get_logger(actor=actor)


# --- metrics -------------------------------------------------------------------

JOB_LABEL = "claimd_job"

_Metric = TypeVar("_Metric", bound=MetricWrapperBase)


def _child(metric: MetricWrapperBase, labelvalues: tuple[object, ...]) -> Any:
    """The existing child for these label values (all strings), or None: one dict lookup.

    prometheus_client's ``labels()`` checks and converts every value and takes a
    lock on every call; the series of the per-run metrics exist from the start
    (``init_job_series``), so the worker's look-ups per run need none of that.
    Reading the dict without the lock is safe: children are only added (under
    it) or removed, and a miss goes the full way.
    """
    children: dict[tuple[object, ...], Any] | None = getattr(metric, "_metrics", None)
    return None if children is None else children.get(labelvalues)


class _PerRunCounter(Counter):
    """A Counter whose ``labels()`` finds an existing series in one look-up."""

    def labels(self: _Metric, *labelvalues: object, **labelkwargs: object) -> _Metric:
        found = None if labelkwargs else _child(self, labelvalues)
        return found if found is not None else super().labels(*labelvalues, **labelkwargs)


class _PerRunHistogram(Histogram):
    """A Histogram whose ``labels()`` finds an existing series in one look-up."""

    def labels(self: _Metric, *labelvalues: object, **labelkwargs: object) -> _Metric:
        found = None if labelkwargs else _child(self, labelvalues)
        return found if found is not None else super().labels(*labelvalues, **labelkwargs)


RUNS_MATERIALIZED = Counter(
    "claimd_runs_materialized_total", "Runs inserted by the materializer (duplicates excluded)"
)
RUNS_MISSED = Counter(
    "claimd_runs_missed_total", "Past instants dropped by a job's catch-up policy", [JOB_LABEL]
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
RUNS_STARTED = _PerRunCounter(
    "claimd_runs_started_total", "Runs a worker moved to running", [JOB_LABEL]
)
RUNS_COMPLETED = _PerRunCounter(
    "claimd_runs_completed_total",
    "Attempts recorded, by outcome (a retried failure counts each attempt)",
    [JOB_LABEL, "outcome"],
)
RUNS_FAILED_FINALLY = _PerRunCounter(
    "claimd_runs_failed_total",
    "Runs this replica recorded failed for good: a failed or timed-out last attempt "
    "(worker), or a lease that expired on the last attempt (reaper)",
    [JOB_LABEL],
)
DELIVERIES_SKIPPED = _PerRunCounter(
    "claimd_deliveries_skipped_total",
    "Deliveries that changed nothing (run terminal, owned elsewhere, stale epoch, unknown)",
    ["reason"],
)
REDELIVERIES = Counter("claimd_redeliveries_total", "Messages JetStream delivered more than once")
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
RUNS_IN_FLIGHT = Gauge("claimd_worker_runs_in_flight", "Runs executing on this worker")
CLOCK_SKEW = Gauge(
    "claimd_clock_skew_seconds",
    "This replica's wall clock minus the database's (positive: ahead), "
    "corrected for half the round trip; claimd decides on the database's clock",
)
# Milliseconds to minutes: a healthy start is tens of ms late, a stalled one minutes.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
SCHEDULE_LAG = _PerRunHistogram(
    "claimd_start_lag_seconds",
    "Start time minus due time (the scheduled instant plus jitter, or the retry time), on "
    "the database's clock; scheduled runs only (manual triggers and backfills are meant "
    "to start late and are not observed)",
    [JOB_LABEL],
    buckets=LAG_BUCKETS,
)
RUN_DURATION = _PerRunHistogram(
    "claimd_run_duration_seconds",
    "Execution time of attempts",
    [JOB_LABEL],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800, 3600),
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


# --- dependencies: is this replica reaching PostgreSQL and NATS? ----------------

DEPENDENCY_UP = Gauge(
    "claimd_dependency_up",
    "1 while this replica reaches the dependency, 0 while it does not",
    ["dependency"],
)
RECONNECTS = Counter(
    "claimd_reconnects_total",
    "Connections to a dependency restored after it was lost",
    ["dependency"],
)


class DependencyHealth:
    """Up/down of one dependency: a log event and the gauge on each change, not on each call.

    ``lost`` after a failure that means the server is unreachable (a refused or
    reset connection, a call that timed out on a silent one); ``reached`` after
    any success. A loss followed by a success counts one reconnect.
    """

    def __init__(self, dependency: str) -> None:
        self.dependency = dependency
        self.up: bool | None = None
        self._log = get_logger(dependency)

    def reached(self, **fields: Any) -> None:
        if self.up is False:
            RECONNECTS.labels(self.dependency).inc()
            # A warning like the loss it ends: a log read at WARNING shows both.
            self._log.warning(
                f"{self.dependency} reachable again", dependency=self.dependency, **fields
            )
        self.up = True
        DEPENDENCY_UP.labels(self.dependency).set(1)

    def lost(self, reason: str, **fields: Any) -> None:
        if self.up is not False:
            self._log.warning(
                f"{self.dependency} unreachable",
                dependency=self.dependency,
                reason=redact(reason),
                **fields,
            )
        self.up = False
        DEPENDENCY_UP.labels(self.dependency).set(0)


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
    "abandoned_here",
)
POISON_REASONS = ("oversized", "not_json", "wrong_schema", "other_deployment", "invalid")
REAP_TRANSITIONS = ("claimed->pending", "running->pending", "running->failed")
ACTORS = ("materializer", "claimer", "dispatcher", "compensator", "reaper", "worker", "clock")
DEPENDENCIES = ("postgres", "nats")
# Why an actor stops taking in work (actors/heartbeat.py names the worker's sources).
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
    for transition in REAP_TRANSITIONS:
        RUNS_REAPED.labels(transition=transition)
    for actor in ACTORS:
        ACTOR_RESTARTS.labels(actor=actor)
        ACTOR_OUTAGES.labels(actor=actor)
    for dependency in DEPENDENCIES:
        RECONNECTS.labels(dependency)
        DEPENDENCY_UP.labels(dependency)  # 0 (not reached) until the first connection
    for actor, reasons in INTAKE_REASONS.items():
        INTAKE_PAUSED.labels(actor=actor)
        for reason in reasons:
            INTAKE_PAUSES.labels(actor=actor, reason=reason)


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


# --- cluster-wide gauges: read from the database, the same on every replica ------------

CLUSTER_NOTE = (
    "scope=cluster: read from the database, every replica reports the same "
    "value; aggregate with max(), never sum()"
)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the cluster gauges report, read in one pass."""

    jobs: tuple[JobSnapshot, ...] = ()
    claimed: int = 0
    running: int = 0
    past_lease: int = 0


@dataclass(eq=False)  # hashable by identity: the registry keys collectors
class ClusterCollector(Collector):
    """Yields the cluster gauges from the last snapshot read (see actors/cluster_metrics.py).

    Nothing here talks to the database: the /metrics handler refreshes the
    snapshot (one query set, rate-limited, with a deadline) before rendering.
    Until the first read succeeds only the age gauge is reported (+Inf).
    """

    snapshot: ClusterSnapshot | None = None
    read_at: float | None = None  # time.monotonic() of the read
    monotonic: Any = field(default=time.monotonic)

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
        def family(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, f"{text}; {CLUSTER_NOTE}", labels=[JOB_LABEL])

        success = family(
            "claimd_job_last_success_timestamp_seconds",
            "When the job's last successful run finished (seconds since the "
            "epoch; absent: never, within the history kept)",
        )
        failure = family(
            "claimd_job_last_failure_timestamp_seconds",
            "When the job's last run that failed for good (failed or timed out, "
            "no attempt left) finished (seconds since the epoch)",
        )
        overdue = family(
            "claimd_job_overdue_runs",
            "The job's runs due and not yet started (0 while it is paused)",
        )
        oldest = family(
            "claimd_job_overdue_oldest_age_seconds",
            "How long the job's oldest run due and not started has been due",
        )
        period = family(
            "claimd_job_period_seconds",
            "The job's schedule period: the longest gap between its next ten "
            "instants (a weekday cron reports its weekend gap)",
        )
        paused = family("claimd_job_paused", "1 while an operator has the job paused")
        behind = family(
            "claimd_job_materialized_behind_seconds",
            "How far the job's materialized rows stop short of now (0: planned "
            "ahead; lasting: no materializer runs and due instants have no row)",
        )
        for job in snap.jobs:
            labels = [job.name]
            if job.last_success is not None:
                success.add_metric(labels, job.last_success)
            if job.last_failure is not None:
                failure.add_metric(labels, job.last_failure)
            overdue.add_metric(labels, job.overdue)
            oldest.add_metric(labels, job.overdue_oldest_age)
            if job.period is not None:
                period.add_metric(labels, job.period)
            paused.add_metric(labels, 1.0 if job.paused else 0.0)
            behind.add_metric(labels, job.materialized_behind)
        yield from (success, failure, overdue, oldest, period, paused, behind)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # names vary with the snapshot; registered without checks


CLUSTER = ClusterCollector()
REGISTRY.register(CLUSTER)

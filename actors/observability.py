"""Logs (structlog, JSON, with run_id and job) and Prometheus metrics.

Metric names count duplicates; they never claim there are none.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram

_SECRET_IN_URL = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")


def redact(text: str) -> str:
    """Remove passwords from URLs (postgresql://u:secret@h -> postgresql://u:***@h)."""
    return _SECRET_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]
                      ) -> MutableMapping[str, Any]:
    for key, value in event.items():
        if isinstance(value, str) and "://" in value:
            event[key] = redact(value)
    return event


def configure_logging(level: str = "INFO", json_logs: bool = True) -> None:
    """JSON lines on stderr, one event per line; libraries' stdlib logs included.

    nats-py and asyncpg log through the standard library (nats-py's reconnect
    errors with their tracebacks): those records are rendered by the same
    processors, so a traceback is one ``exception`` field of one JSON line.
    """
    renderer: Any = (structlog.processors.JSONRenderer() if json_logs
                     else structlog.dev.ConsoleRenderer(colors=False))
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, _redact_processor, renderer]))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
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


RUNS_MATERIALIZED = Counter("claimd_runs_materialized_total",
                            "Runs inserted by the materializer (duplicates excluded)")
RUNS_MISSED = Counter("claimd_runs_missed_total",
                      "Past instants dropped by a job's catch-up policy", ["job"])
RUNS_SKIPPED = Counter("claimd_runs_skipped_total",
                       "Due runs recorded skipped by policy (deadline, overlap, catch-up)")
RUNS_CLAIMED = Counter("claimd_runs_claimed_total", "Runs claimed by this replica")
PUBLISHED = Counter("claimd_dispatch_published_total", "Dispatch messages acked by JetStream")
PUBLISH_FAILED = Counter("claimd_dispatch_publish_failed_total",
                         "Dispatch publishes that failed and went to the compensator")
RUNS_RELEASED = Counter("claimd_runs_released_total",
                        "Unpublished runs the compensator returned to pending")
RUNS_REAPED = Counter("claimd_runs_reaped_total", "Runs whose lease expired", ["transition"])
RUNS_PRUNED = Counter("claimd_runs_pruned_total", "Terminal runs deleted by history retention")
RUNS_STARTED = Counter("claimd_runs_started_total", "Runs a worker moved to running", ["job"])
RUNS_COMPLETED = Counter("claimd_runs_completed_total", "Attempts recorded", ["job", "outcome"])
DELIVERIES_SKIPPED = Counter(
    "claimd_deliveries_skipped_total",
    "Deliveries that changed nothing (run terminal, owned elsewhere, stale epoch, unknown)",
    ["reason"])
REDELIVERIES = Counter("claimd_redeliveries_total",
                       "Messages JetStream delivered more than once")
FENCED_COMPLETIONS = Counter(
    "claimd_fenced_completions_total",
    "Completions refused because the run's epoch moved on (a duplicate execution)")
POISON_MESSAGES = Counter("claimd_poison_messages_total",
                          "Messages on the dispatch subject that were not valid dispatches",
                          ["reason"])
COMPLETIONS_REJECTED = Counter(
    "claimd_completions_rejected_total",
    "Completions not recorded for a reason other than an outage (refused, or an error); "
    "left to the lease and the reaper")
LEASES_LOST = Counter("claimd_leases_lost_total",
                      "Running runs whose lease extension was refused (reaped or cancelled)")
ACTOR_OUTAGES = Counter("claimd_actor_outages_total",
                        "Actor restarts because a server was unavailable", ["actor"])
ACTOR_RESTARTS = Counter("claimd_actor_restarts_total", "Actor crashes restarted", ["actor"])
CONFIG_JOB_ERRORS = Gauge("claimd_config_job_errors", "Jobs in the config file that are invalid")
RUNS_IN_FLIGHT = Gauge("claimd_worker_runs_in_flight", "Runs executing on this worker")
CLOCK_SKEW = Gauge("claimd_clock_skew_seconds",
                   "This replica's wall clock minus the database's (positive: ahead), "
                   "corrected for half the round trip; claimd decides on the database's clock")
SCHEDULE_LAG = Histogram("claimd_start_lag_seconds",
                         "Start time minus scheduled time, on the database's clock",
                         buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
RUN_DURATION = Histogram("claimd_run_duration_seconds", "Execution time of attempts", ["job"],
                         buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 1800, 3600))


# --- dependencies: is this replica reaching PostgreSQL and NATS? ----------------

DEPENDENCY_UP = Gauge("claimd_dependency_up",
                      "1 while this replica reaches the dependency, 0 while it does not",
                      ["dependency"])
RECONNECTS = Counter("claimd_reconnects_total",
                     "Connections to a dependency restored after it was lost", ["dependency"])


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
            self._log.warning(f"{self.dependency} reachable again",
                              dependency=self.dependency, **fields)
        self.up = True
        DEPENDENCY_UP.labels(self.dependency).set(1)

    def lost(self, reason: str, **fields: Any) -> None:
        if self.up is not False:
            self._log.warning(f"{self.dependency} unreachable", dependency=self.dependency,
                              reason=redact(reason), **fields)
        self.up = False
        DEPENDENCY_UP.labels(self.dependency).set(0)

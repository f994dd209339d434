"""Every default claimd has, declared once.

The config file's models (``actors.config``), the domain's dataclasses (Job,
RetryPolicy, HttpSpec, the lease) and the codec of stored definitions
(``actors.domain.definitions``) all read their defaults here, so that a key
left out of the config file, a Job built in code and a stored definition
missing a field mean the same thing. ``tests/unit/test_defaults.py`` builds a
job and the settings from a minimal config and compares every field with
these.

Plain values only (no domain types): the domain modules import this one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

# --- the lease and the broker (actors.domain.lease checks them at import) ------------

LEASE = timedelta(seconds=120)
ACK_WAIT = timedelta(seconds=5)
MAX_DELIVER = 5
# How long before its instant a run is claimed (then held by its worker), where
# it fits the lease (see Settings.effective_claim_ahead). Long enough for a herd
# (10,000 runs of one instant on a 2-core machine: claim, publish and fetch take
# 1-3 s there) to be in its workers' hands at the instant, so that only the
# start statements stand between the instant and the executions.
CLAIM_AHEAD = timedelta(seconds=5)
# Async python callables executing at once on a worker (their own pool of slots).
WORKER_ASYNC_CONCURRENCY = 10_000
# Warm child processes a replica keeps for sync python attempts, when the setting
# ``python_processes`` is unset and nothing else says (the worker's
# ``worker_concurrency`` does in a replica: every sync attempt in a slot has a child).
PYTHON_PROCESSES = 64

# --- a job (``[jobs.NAME]``) ---------------------------------------------------------

TIMEZONE = "UTC"
TIMEOUT = timedelta(hours=1)
MAX_ATTEMPTS = 3
ENABLED = True
OVERLAP: Final = "allow"  # actors.domain.jobs.Overlap
CATCHUP: Final = "all"  # actors.domain.jobs.Catchup
CATCHUP_WINDOW = timedelta(hours=1)
JITTER = timedelta(0)
# A fixed-time cron job at DST transitions (``dst = {...}``; actors.domain.schedule.DstPolicy):
# a time the clock skips runs at the end of the gap, a time it repeats runs once, first.
DST_GAP: Final = "shift"  # shift | skip
DST_FOLD: Final = "first"  # first | last | both
# starting_deadline has no default value: unset, the catch-up window decides
# (Job.start_deadline).

# --- the retry backoff (``backoff = {...}``; actors.domain.attempts.RetryPolicy) ------

RETRY_INITIAL = timedelta(seconds=1)
RETRY_MAXIMUM = timedelta(minutes=5)
RETRY_MULTIPLIER = 2.0

# --- executors -----------------------------------------------------------------------

HTTP_METHOD: Final = "POST"
# The statuses an http job counts as success.
HTTP_EXPECT_STATUS: tuple[int, ...] = (200, 201, 202, 204)

# --- what an operator sees (actors.domain.job_state) ---------------------------------

# A run due this long and not started makes its job overdue: one due a moment ago
# is being started (the claimer takes runs ahead and starts them at their instant).
# The API's state, the page, `claimd jobs` and claimd_job_overdue_runs all use it.
OVERDUE_AFTER = timedelta(seconds=10)

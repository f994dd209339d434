"""The store's rules on one row, as SQL fragments spliced into the statements.

Each constant is the SQL of the pure predicate of the same name (in lower case) in
actors/domain/row_rules.py, which says what the rule means and why; the in-memory
store calls that predicate. tests/contract/test_row_rules.py holds the two to one
table of cases, on both stores. Change a rule in both places, in one commit.

The aliases are fixed: ``r`` the run judged, ``j`` its job, ``n`` a newer instant of
the same job (MOVED_ON), ``a`` any run of the job (JOB_BUSY); a statement that names
them otherwise renames them with :func:`aliased`. The fences judge the row as their
lock CTE (``l``; ``p`` in COMPLETE_RUNS) read it (``at_state``, ``at_epoch``,
``at_owner``) against the caller's ``epoch``: see "row locks" in the package's
docstring. Constants only: never input.

One predicate is two fragments: ``overlap_forbidden`` is OVERLAP_FORBIDDEN (the run's
side) within OVERLAP_FORBIDDEN_JOB (the job's), as SKIP_UNRUNNABLE reads them.
tests/unit/test_row_rules.py checks that every fragment has its predicate.
"""

from __future__ import annotations

import re

# fmt: off
# SQL keeps its hand layout here.

JOB_OPEN = "j.enabled AND NOT j.paused"

# $4: claim_ahead, in both claims.
CLAIMABLE = "r.state = 'pending' AND r.due_at <= now() + $4::interval"

RUNS_BESIDE_OTHERS = "(j.overlap = 'allow' OR r.overlap = 'allow')"

JOB_BUSY = """EXISTS (SELECT 1 FROM job_runs a
                WHERE a.job_id = j.id AND a.state IN ('claimed', 'running'))"""

MOVED_ON = """(n.state IN ('claimed', 'running', 'succeeded', 'failed')
                 OR (n.state = 'pending' AND n.due_at <= now()))"""

DEADLINE_MISSED = """r.trigger = 'schedule' AND r.attempt = 1
         AND r.scheduled_at < now() - j.start_deadline"""

SUPERSEDED = """j.catchup = 'latest' AND r.trigger = 'schedule' AND EXISTS (
         SELECT 1 FROM job_runs n
          WHERE n.job_id = r.job_id AND n.trigger = 'schedule'
            AND n.scheduled_at > r.scheduled_at AND n.scheduled_at <= now()
            AND """ + MOVED_ON + """)"""  # noqa: S608 - constants only

# Both parts read only the row, its job and (for SUPERSEDED) one index range of the
# job's instants between this one and now: the cost follows the candidates judged,
# not the backlog.
MUST_NOT_RUN = """CASE
    WHEN """ + DEADLINE_MISSED + """
    THEN 'missed its starting deadline'
    WHEN """ + SUPERSEDED + """
    THEN 'superseded by a later instant (catchup = latest)'
END"""

# The job's side and the run's: SKIP_UNRUNNABLE puts the first around the lateral that
# reads the second.
OVERLAP_FORBIDDEN_JOB = "j.overlap = 'forbid' AND " + JOB_BUSY
OVERLAP_FORBIDDEN = """r.state = 'pending' AND r.scheduled_at <= now()
              AND r.due_at <= now() AND COALESCE(r.overlap, 'forbid') = 'forbid'"""

LEASE_EXPIRED = "r.state IN ('claimed', 'running') AND r.lease_expires_at < now()"

# $1: the owner, in RELEASE_UNPUBLISHED and EXTEND_LEASES.
HELD_CLAIMED = "l.at_state = 'claimed' AND l.at_epoch = l.epoch AND l.at_owner = $1"
HELD_RUNNING = "l.at_state = 'running' AND l.at_epoch = l.epoch AND l.at_owner = $1"

# $3: the worker, in START_RUNS; ``l.retake``: its word that the start never reached it.
STARTABLE = """l.at_epoch = l.epoch
       AND (l.at_state = 'claimed'
            OR (l.at_state = 'running' AND l.at_owner = $3 AND l.retake))"""

DUE_TO_START = "(l.at_state <> 'claimed' OR l.at_due)"

COMPLETION_ACCEPTED = "p.at_state = 'running' AND p.at_epoch = p.epoch"

# $1: older_than.
PRUNABLE = """r.state IN ('succeeded', 'failed', 'skipped', 'cancelled')
           AND r.finished_at < now() - $1::interval"""
# fmt: on


def aliased(fragment: str, **names: str) -> str:
    """``fragment`` with its row aliases renamed: ``aliased(JOB_OPEN, j="p")``."""
    for old, new in names.items():
        fragment = re.sub(rf"\b{old}\.", f"{new}.", fragment)
    return fragment

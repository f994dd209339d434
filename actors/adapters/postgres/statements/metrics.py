"""Cluster-wide figures for /metrics, read straight from the truth."""

from actors.adapters.postgres.statements.job_figures import (
    LAST_OUTCOME,
    LAST_SUCCESS,
    REJECTED,
    RUNNING,
    backlog,
)

# Read on scrape (rate-limited by actors/replica/cluster_reader.py), so every replica
# reports the same figures straight from the truth, through the fragments the
# job listing uses (statements/job_figures.py). "Overdue": the backlog due more
# than $1 (OVERDUE_AFTER) ago, of enabled jobs that are not paused; the last
# outcome, the runs running and the rejection decide the job's state
# (claimd_job_state). Each part uses an index (one probe per job). The
# definition (for the period) comes from stored_definitions, once per fingerprint.
CLUSTER_JOB_FIGURES = f"""
WITH {backlog("$1")}
SELECT j.id, j.name, j.paused, j.fingerprint,
       ls.last_success, f.finished_at AS last_failure, lt.state AS last_state, x.running,
       {REJECTED},
       CASE WHEN j.paused THEN 0 ELSE coalesce(b.overdue, 0) END AS overdue,
       CASE WHEN j.paused OR b.oldest_due IS NULL THEN 0
            ELSE extract(epoch FROM now() - b.oldest_due) END::float8 AS overdue_oldest_age,
       CASE WHEN j.paused THEN 0
            ELSE greatest(0, extract(epoch FROM
                 now() - coalesce(j.materialized_until, j.created_at))) END::float8
           AS materialized_behind
  FROM jobs j
  LEFT JOIN backlog b ON b.job_id = j.id
  {LAST_SUCCESS}
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'failed'
                      ORDER BY r.finished_at DESC LIMIT 1) f ON true
  {LAST_OUTCOME}
  {RUNNING}
 WHERE j.enabled
 ORDER BY j.name
"""  # noqa: S608 - spliced from constants, never from input
CLUSTER_LEASE_FIGURES = """
SELECT count(*) FILTER (WHERE state = 'claimed') AS claimed,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE lease_expires_at < now()) AS past_lease
  FROM job_runs WHERE state IN ('claimed', 'running')
"""

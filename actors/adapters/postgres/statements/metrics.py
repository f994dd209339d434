"""Cluster-wide figures for /metrics, read straight from the truth."""

# Read on scrape (rate-limited by actors/replica/cluster_reader.py), so every replica
# reports the same figures straight from the truth. "Overdue": due and not yet
# started (pending, or claimed and still on its way to a worker), of enabled
# jobs that are not paused. Each part uses an index: the pending partial index,
# the leased one, and job_runs_job_last_finished (one probe per job). The
# definition (for the period) comes from stored_definitions, once per fingerprint.
CLUSTER_JOB_FIGURES = """
WITH due AS (
    SELECT job_id, due_at FROM job_runs WHERE state = 'pending' AND due_at <= now()
    UNION ALL
    SELECT job_id, due_at FROM job_runs WHERE state = 'claimed' AND due_at <= now()
),
overdue AS (SELECT job_id, count(*) AS n, min(due_at) AS oldest FROM due GROUP BY job_id)
SELECT j.id, j.name, j.paused, j.fingerprint,
       s.finished_at AS last_success, f.finished_at AS last_failure,
       CASE WHEN j.paused THEN 0 ELSE coalesce(o.n, 0) END AS overdue,
       CASE WHEN j.paused OR o.oldest IS NULL THEN 0
            ELSE extract(epoch FROM now() - o.oldest) END::float8 AS overdue_oldest_age,
       CASE WHEN j.paused THEN 0
            ELSE greatest(0, extract(epoch FROM
                 now() - coalesce(j.materialized_until, j.created_at))) END::float8
           AS materialized_behind
  FROM jobs j
  LEFT JOIN overdue o ON o.job_id = j.id
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'succeeded'
                      ORDER BY r.finished_at DESC LIMIT 1) s ON true
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'failed'
                      ORDER BY r.finished_at DESC LIMIT 1) f ON true
 WHERE j.enabled
 ORDER BY j.name
"""
CLUSTER_LEASE_FIGURES = """
SELECT count(*) FILTER (WHERE state = 'claimed') AS claimed,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE lease_expires_at < now()) AS past_lease
  FROM job_runs WHERE state IN ('claimed', 'running')
"""

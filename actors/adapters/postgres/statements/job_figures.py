"""A job's figures, written once: the job listing (``history.JOBS_OVERVIEW``) and the
cluster gauges (``metrics.CLUSTER_JOB_FIGURES``) splice the same fragments, so the page,
``claimd jobs`` and /metrics read one backlog, one last success and one last outcome,
and decide one state from them (actors.domain.job_state).

Each fragment joins on ``j`` (a row of ``jobs``).
"""


def backlog(overdue_after: str) -> str:
    """The ``backlog`` CTE: per job, its runs due and not started (pending, or claimed and
    on their way to a worker: due_at past), the oldest one's due time and how many of them
    are overdue (due more than the interval ``overdue_after``, a parameter, ago).

    Read through the pending partial index and the leased one, whatever the number of jobs.
    """
    return f"""backlog AS (
    SELECT job_id, count(*) AS backlog, min(due_at) AS oldest_due,
           count(*) FILTER (WHERE due_at <= now() - {overdue_after}::interval) AS overdue
      FROM (SELECT job_id, due_at FROM job_runs WHERE state = 'pending' AND due_at <= now()
            UNION ALL
            SELECT job_id, due_at FROM job_runs WHERE state = 'claimed' AND due_at <= now()) d
     GROUP BY job_id
)"""  # noqa: S608 - a parameter's name, never input


# When the job's last successful run finished (one probe of job_runs_job_last_finished).
LAST_SUCCESS = """
  LEFT JOIN LATERAL (SELECT r.finished_at AS last_success FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'succeeded'
                      ORDER BY r.finished_at DESC LIMIT 1) ls ON true"""

# The job's last finished run (terminal, scheduled at or before now: a future run
# cancelled by a removal has not happened): its state decides "failing".
LAST_OUTCOME = """
  LEFT JOIN LATERAL (SELECT r.id, r.state, r.outcome, r.error, r.scheduled_at, r.finished_at,
                            r.trigger
                       FROM job_runs r
                      WHERE r.job_id = j.id
                        AND r.state IN ('succeeded', 'failed', 'skipped', 'cancelled')
                        AND r.scheduled_at <= now()
                      ORDER BY r.scheduled_at DESC LIMIT 1) lt ON true"""

# The job's runs running now (the active index).
RUNNING = """
  LEFT JOIN LATERAL (SELECT count(*) AS running FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'running') x ON true"""

# Whether the config file rejected the job (or its last edit) at the last load.
REJECTED = "EXISTS (SELECT 1 FROM config_rejected_jobs c WHERE c.job = j.name) AS rejected"

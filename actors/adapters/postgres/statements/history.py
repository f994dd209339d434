"""What happened (runs, attempts, gaps) and who did what (operator actions): the
statements of the operator's reads, the gaps a plan drops and the action log."""

from actors.adapters.postgres.statements.job_figures import (
    LAST_OUTCOME,
    LAST_SUCCESS,
    RUNNING,
    backlog,
)

TERMINAL = ["succeeded", "failed", "skipped", "cancelled"]

# --- written by the materializer, in the transaction that writes the plan ------

# A gap is written only for jobs whose plan is current (the ids the guarded
# high-water update returned, which also row-locks them), and only where no
# gap of the job overlaps it yet: two replicas that planned from the same mark
# take the lock one after the other, so the second sees the first's gap. The
# instants that one's range has and the other's lacks were future instants to
# the other, which wrote them as rows.
RECORD_GAPS = """
INSERT INTO job_run_gaps (job_id, from_at, to_at, count, reason)
SELECT u.job_id, u.from_at, u.to_at, u.count, u.reason
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], $5::text[])
       AS u(job_id, from_at, to_at, count, reason)
 WHERE u.job_id = ANY ($6::bigint[])
   AND NOT EXISTS (SELECT 1 FROM job_run_gaps g
                    WHERE g.job_id = u.job_id AND g.from_at <= u.to_at AND g.to_at >= u.from_at)
RETURNING job_id, count
"""


# --- reads ---------------------------------------------------------------------

DB_NOW = "SELECT now()"

# One row per job; each figure is one index range of that job's rows, written
# once in statements/job_figures.py (the cluster gauges read the same ones).
# $1: a job's name (NULL: every job); $2: the overdue threshold (OVERDUE_AFTER).
JOBS_OVERVIEW = f"""
WITH {backlog("$2")}
SELECT j.id, j.name, j.definition, j.enabled, j.paused, j.created_at, j.history_pruned_through,
       COALESCE(j.planned_since, j.created_at) AS due_since,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       COALESCE(b.backlog, 0) AS backlog, b.oldest_due, COALESCE(b.overdue, 0) AS overdue,
       a.ahead, x.running,
       lt.id::text AS last_run_id, lt.state AS last_state, lt.outcome AS last_outcome,
       lt.error AS last_error, lt.scheduled_at AS last_scheduled_at,
       lt.finished_at AS last_finished_at, lt.trigger AS last_trigger,
       ls.last_success, f.failures_24h
  FROM jobs j
  LEFT JOIN backlog b ON b.job_id = j.id
  LEFT JOIN LATERAL (SELECT count(*) AS ahead FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'pending' AND r.due_at > now()) a ON true
  {RUNNING}
  {LAST_OUTCOME}
  {LAST_SUCCESS}
  LEFT JOIN LATERAL (SELECT count(*) AS failures_24h FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'failed'
                        AND r.scheduled_at > now() - interval '24 hours') f ON true
 WHERE ($1::text IS NULL OR j.name = $1)
 ORDER BY j.name
"""  # noqa: S608 - spliced from constants, never from input
# Newest first, a page at a time: the cursor is the last row's (scheduled_at, id).
# What has happened (scheduled at or before now) unless $8 asks for the
# look-ahead too: the rows the materializer writes ahead would otherwise open
# every listing of a frequent job.
RUNS_PAGE = """
SELECT r.id::text AS id, j.name AS job,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       r.scheduled_at, r.due_at, r.state, r.trigger, r.attempt, r.claim_epoch, r.lease_owner,
       r.lease_expires_at, r.claimed_at, r.started_at, r.finished_at, r.outcome, r.exit_code,
       r.error, r.overlap, r.created_at, r.updated_at
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE ($1::bigint IS NULL OR r.job_id = $1)
   AND ($2::text[] IS NULL OR r.state = ANY ($2))
   AND ($3::timestamptz IS NULL OR r.scheduled_at >= $3)
   AND ($4::timestamptz IS NULL OR r.scheduled_at <= $4)
   AND ($5::timestamptz IS NULL OR (r.scheduled_at, r.id) < ($5, $6::uuid))
   AND ($8 OR r.scheduled_at <= now())
 ORDER BY r.scheduled_at DESC, r.id DESC
 LIMIT $7
"""
RUN_DETAIL = """
SELECT r.id::text AS id, j.name AS job,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone,
       r.scheduled_at, r.due_at, r.state, r.trigger, r.attempt, r.claim_epoch, r.lease_owner,
       r.lease_expires_at, r.claimed_at, r.started_at, r.finished_at, r.outcome, r.exit_code,
       r.error, r.overlap, r.created_at, r.updated_at,
       r.output_tail, now() AS now
  FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE r.id = $1::uuid
"""
RUN_ATTEMPTS = """
SELECT attempt, claim_epoch, worker, started_at, finished_at, outcome, exit_code, error,
       output_tail
  FROM job_run_attempts WHERE run_id = $1::uuid ORDER BY finished_at, claim_epoch
"""
JOB_RECORD = """
SELECT j.id, j.name, j.definition, j.enabled, j.paused, j.history_pruned_through,
       COALESCE(j.planned_since, j.created_at) AS due_since,
       COALESCE(j.definition -> 'schedule' ->> 'timezone', 'UTC') AS timezone, now() AS now
  FROM jobs j WHERE j.name = $1
"""
AUDIT_RUNS = """
SELECT id::text AS id, scheduled_at, state, trigger, attempt, error, lease_expires_at
  FROM job_runs WHERE job_id = $1 AND scheduled_at BETWEEN $2 AND $3
 ORDER BY scheduled_at LIMIT $4
"""
AUDIT_GAPS = """
SELECT from_at, to_at, count, reason FROM job_run_gaps
 WHERE job_id = $1 AND from_at <= $3 AND to_at >= $2 ORDER BY from_at
"""
# The jobs the config file rejected at the last load (sql/0011). One that is in
# the catalog and enabled still runs the definition it had before the edit.
REJECTED_JOBS = """
SELECT c.job, c.path, c.field, c.error, c.replica, c.recorded_at,
       COALESCE(j.enabled, false) AS old_definition_running
  FROM config_rejected_jobs c LEFT JOIN jobs j ON j.name = c.job
 ORDER BY c.job
"""
# A job's pauses and resumes that took effect, in order: the spans the audit
# calls "paused" rather than "missing".
PAUSES = """
SELECT action, at FROM operator_actions
 WHERE job = $1 AND action IN ('pause', 'resume') AND ok ORDER BY id
"""
RECORD_ACTION = """
INSERT INTO operator_actions (actor, via, origin, action, job, run_id, arguments, ok, result)
VALUES ($1, $2, $3, $4, $5, $6::uuid, $7::jsonb, $8, $9)
RETURNING id, at
"""
ACTIONS_PAGE = """
SELECT id, at, actor, via, origin, action, job, run_id::text AS run_id, arguments, ok, result
  FROM operator_actions
 WHERE ($1::text IS NULL OR job = $1) AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC LIMIT $3
"""
LAST_ACTION_ID = "SELECT COALESCE(max(id), 0) FROM operator_actions"
# What a replica recorded after a SIGHUP from this pid, newer than a given action.
# A signal's verdict (actor 'sighup'), not the config watch's ('config-watch').
RELOAD_VERDICT = """
SELECT id, ok, result, arguments FROM operator_actions
 WHERE action = 'reload' AND via = 'signal' AND actor = 'sighup' AND id > $1
   AND arguments ->> 'pid' = $2
 ORDER BY id LIMIT 1
"""

# --- the run grid ----------------------------------------------------------------
# The grid judges each job's last instants as the audit does, over a range that
# differs per job. Read a job at a time, 1,000 jobs were 2,000 statements and
# 1,000 transactions (3-5 s); each kind here is one statement over every job's
# range, the two read in one snapshot.

# Each job's rows in [its start, $3], at most $4 of them (the audit's bound),
# through the (job_id, scheduled_at) index.
GRID_RUNS = """
SELECT u.job_id, r.id::text AS id, r.scheduled_at, r.state, r.trigger, r.attempt, r.error,
       r.lease_expires_at
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(job_id, from_at)
  CROSS JOIN LATERAL (SELECT id, scheduled_at, state, trigger, attempt, error, lease_expires_at
                        FROM job_runs
                       WHERE job_id = u.job_id AND scheduled_at BETWEEN u.from_at AND $3
                       ORDER BY scheduled_at LIMIT $4) r
 ORDER BY u.job_id, r.scheduled_at
"""
GRID_GAPS = """
SELECT g.job_id, g.from_at, g.to_at, g.count, g.reason
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(job_id, from_at)
  JOIN job_run_gaps g ON g.job_id = u.job_id AND g.from_at <= $3 AND g.to_at >= u.from_at
 ORDER BY g.job_id, g.from_at
"""
# The pauses and resumes that took effect, of every job named, in order.
GRID_PAUSES = """
SELECT job, action, at FROM operator_actions
 WHERE job = ANY ($1::text[]) AND action IN ('pause', 'resume') AND ok ORDER BY id
"""

"""Operator actions: pause, trigger, backfill's inserts, cancel, pruning."""

# fmt: off
# SQL keeps its hand layout here: the formatter would split the spliced
# constants across lines and separate each noqa from the line it covers.

from actors.adapters.postgres.statements.row_rules import PRUNABLE

# Pausing also hands back the job's runs claimed and not yet started (claimed
# ahead, or waiting in the stream): pending again, as if never claimed, under
# the same epoch, so their messages are stale and the worker's start drops
# them; on resume they are claimed afresh (a new epoch) and judged then, like
# every run that waited out the pause. A run already running finishes. The
# job row is locked before its runs, in the order the sync and the
# materializer take them.
SET_PAUSED = """
WITH j AS (
    UPDATE jobs SET paused = $2, updated_at = now() WHERE name = $1 AND enabled RETURNING id
),
held AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE $2 AND r.job_id IN (SELECT id FROM j) AND r.state = 'claimed'
     ORDER BY r.id
       FOR NO KEY UPDATE
),
back AS (
    UPDATE job_runs r
       SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
           updated_at = now()
      FROM held h WHERE r.id = h.id AND r.state = 'claimed'
    RETURNING 1
)
SELECT id FROM j
"""
JOB_BY_NAME = "SELECT id, definition, enabled FROM jobs WHERE name = $1"
# A resume: where the job's plan stands (the caller holds the job row locked), the
# moment its pause took effect (recorded in the pause's own transaction) and the
# runs written ahead that came due meanwhile, counted for the answer.
PAUSED_JOB = """
SELECT j.id, j.definition, j.materialized_until, j.created_at, now() AS now,
       (SELECT a.at FROM operator_actions a
         WHERE a.job = j.name AND a.action = 'pause' AND a.ok ORDER BY a.id DESC LIMIT 1)
           AS paused_at,
       (SELECT count(*) FROM job_runs r
         WHERE r.job_id = j.id AND r.state = 'pending' AND r.due_at <= now()) AS due_now
  FROM jobs j WHERE j.name = $1 AND j.enabled
"""
# `resume --paused-instants skip`: the job's scheduled runs written ahead whose
# instant came while it was paused, and are not started, end skipped with the
# reason. Manual and backfilled runs are an operator's own and are left to run.
SKIP_PAUSED_RUNS = """
WITH skipped AS (
    UPDATE job_runs SET state = 'skipped', outcome = 'skipped', error = $3,
           finished_at = now(), updated_at = now()
     WHERE job_id = $1 AND state = 'pending' AND trigger = 'schedule'
       AND scheduled_at >= $2 AND scheduled_at <= now()
    RETURNING 1
)
SELECT count(*) FROM skipped
"""
# ... and its plan resumes from now: the instants up to it that have no row are
# recorded as gaps in the same transaction (RECORD_GAPS), so none is missing.
MOVE_MARK_TO_NOW = """
UPDATE jobs SET materialized_until = GREATEST(materialized_until, now()) WHERE id = $1
"""
# An ad-hoc or backfilled run is still one row per (job, instant): a repeated
# trigger for the same instant, or a second backfill, inserts nothing. $4: the
# runs' own overlap mode (sql/0015), NULL for the job's.
INSERT_RUNS_AT = """
INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger, overlap)
SELECT $1, t, now(), $3, $4::text FROM unnest($2::timestamptz[]) AS t
ON CONFLICT ON CONSTRAINT job_runs_one_row_per_instant DO NOTHING
RETURNING id::text
"""
# Cancelling a running run takes its lease away: the worker's next heartbeat
# is refused, it cancels the execution, and its completion is fenced.
CANCEL_RUN = """
UPDATE job_runs SET state = 'cancelled', outcome = 'cancelled', error = $2,
       finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
 WHERE id = $1::uuid AND state IN ('pending', 'claimed', 'running')
RETURNING id::text
"""
# Retention: terminal history older than the cut-off, a small batch at a time
# so that pruning never holds many locks or a long transaction. SKIP LOCKED:
# replicas pruning at once take disjoint batches and never wait on each other.
# Each job's history_pruned_through moves to the latest instant deleted, in the
# same statement (sql/0012), so the audit never sees a pruned row as missing.
PRUNE_HISTORY = """
WITH gone AS (
    DELETE FROM job_runs WHERE id IN (
        SELECT r.id FROM job_runs r
         WHERE """ + PRUNABLE + """
         ORDER BY r.finished_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED)
    RETURNING job_id, scheduled_at),
marked AS (
    UPDATE jobs j
       SET history_pruned_through = GREATEST(j.history_pruned_through, g.last)
      FROM (SELECT job_id, max(scheduled_at) AS last FROM gone GROUP BY job_id) g
     WHERE j.id = g.job_id
    RETURNING 1)
SELECT count(*) FROM gone
"""  # noqa: S608 - spliced from a constant, never from input
# An action's checks, in its transaction: the job row locked (as SET_PAUSED
# locks it) so that two pauses of one job are decided one after the other.
LOCK_JOB = "SELECT id, paused FROM jobs WHERE name = $1 AND enabled FOR UPDATE"
RUN_STATE = "SELECT state FROM job_runs WHERE id = $1::uuid"
# A job's run claimed or running, if any (job_runs_active_by_job): what an
# operator's new run of a forbid or queue job would wait for, or be skipped by.
ACTIVE_RUN = """
SELECT r.id::text AS id, r.state FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE j.name = $1 AND r.state IN ('claimed', 'running')
 ORDER BY r.scheduled_at LIMIT 1
"""
RUN_JOB = "SELECT j.name FROM job_runs r JOIN jobs j ON j.id = r.job_id WHERE r.id = $1::uuid"

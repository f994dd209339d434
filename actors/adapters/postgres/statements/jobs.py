"""The job catalog: syncing the config's jobs into ``jobs``; reading the active ones."""

# A sync reads what the table holds first and writes only the jobs whose
# definition or enabled flag differ: at 100,000 jobs an unchanged restart or
# reload is one read, not 100,000 upserts (and the catalog version, sql/0009,
# moves only when something changed).
JOBS_AS_SYNCED = "SELECT id, name, fingerprint, enabled FROM jobs"
# Syncs (replicas starting, reloads) take turns: each reads the table and
# writes the difference, so two syncs at once must not interleave. The lock is
# per schema and ends with the transaction. It is tried first (a replica that
# must wait says so), then waited for under a deadline of its own: a sync of
# 100,000 new jobs holds it for many seconds, longer than any one statement
# may take, and a replica starting beside it must not fail its start on the
# statement's deadline.
TRY_LOCK_SYNC = "SELECT pg_try_advisory_xact_lock(hashtext('claimd.sync:' || current_schema()))"
LOCK_SYNC = "SELECT pg_advisory_xact_lock(hashtext('claimd.sync:' || current_schema()))"
# The schedules of the jobs about to change, before the change: a job whose
# schedule changes has its future runs withdrawn (WITHDRAW_FUTURE_RUNS).
OLD_SCHEDULES = """
SELECT id, definition -> 'schedule' AS schedule FROM jobs WHERE id = ANY ($1::bigint[])
"""
# Every job row the sync changes is locked first, in id order, as the
# materializer's high-water update locks its rows (see "row locks" in
# __init__): two statements that share rows then wait, never deadlock. Jobs
# new to the table are inserted in name order, so two syncs adding the same
# jobs wait on each other's inserts in one order too.
LOCK_JOBS_FOR_SYNC = """
SELECT id FROM jobs WHERE id = ANY ($1::bigint[]) ORDER BY id FOR NO KEY UPDATE
"""
UPSERT_JOBS = """
INSERT INTO jobs (name, definition, fingerprint, enabled, max_attempts, overlap, catchup,
                  start_deadline)
SELECT * FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::bool[], $5::int[], $6::text[],
                     $7::text[], $8::interval[])
 ORDER BY 1
ON CONFLICT (name) DO UPDATE
   SET definition = EXCLUDED.definition,
       fingerprint = EXCLUDED.fingerprint,
       enabled = EXCLUDED.enabled,
       max_attempts = EXCLUDED.max_attempts,
       overlap = EXCLUDED.overlap,
       catchup = EXCLUDED.catchup,
       start_deadline = EXCLUDED.start_deadline,
       updated_at = now()
 WHERE jobs.fingerprint IS DISTINCT FROM EXCLUDED.fingerprint
    OR jobs.enabled IS DISTINCT FROM EXCLUDED.enabled
RETURNING id, name, (xmax = 0) AS inserted
"""
# A changed schedule: future runs of the old schedule are withdrawn and the
# materializer starts again from now (where the audit starts judging it).
# "Future" includes a run claimed ahead (claim_ahead) and not yet started: its
# instant is still ahead, so it is as much the old schedule's as a pending one.
# Its message is in the stream; the worker's start finds no row and drops it
# (START_RUNS locks the row too, so a start and a withdrawal are serialized:
# a run already started is running, and no longer matched here). If the new
# schedule has the same instant, the materializer plans it again.
WITHDRAW_FUTURE_RUNS = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM job_runs
     WHERE job_id = $1 AND state IN ('pending', 'claimed') AND trigger = 'schedule'
       AND scheduled_at > now()
     ORDER BY id
       FOR UPDATE
),
gone AS (
    DELETE FROM job_runs r USING doomed d
     WHERE r.id = d.id AND r.state IN ('pending', 'claimed') AND r.trigger = 'schedule'
       AND r.scheduled_at > now()
    RETURNING 1
)
UPDATE jobs SET materialized_until = now(), planned_since = now() WHERE id = $1
RETURNING (SELECT count(*) FROM gone) AS withdrawn
"""
# A job removed from the config file is disabled, its history kept and its
# runs not yet started cancelled ($2: REMOVED_FROM_CONFIG): pending ones, and
# claimed ones (claimed ahead, or waiting in the stream), whose start then
# finds them terminal. A run already running finishes; the row locks
# serialize this with a start.
DISABLE_REMOVED_JOBS = """
WITH off AS (
    UPDATE jobs SET enabled = false, updated_at = now()
     WHERE enabled AND NOT (name = ANY($1::text[]))
    RETURNING id
),
doomed AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE r.job_id IN (SELECT id FROM off) AND r.state IN ('pending', 'claimed')
     ORDER BY r.id
       FOR NO KEY UPDATE
)
UPDATE job_runs r SET state = 'cancelled', outcome = 'cancelled', error = $2,
       lease_owner = NULL, lease_expires_at = NULL, finished_at = now(), updated_at = now()
  FROM doomed d WHERE r.id = d.id AND r.state IN ('pending', 'claimed')
RETURNING r.id
"""
# A job back in the config (removed and added again: a reload storm, a revert)
# is owed every instant that comes due from now on. Its rows made ahead were
# cancelled by the removal ($2: REMOVED_FROM_CONFIG, by DISABLE_REMOVED_JOBS or
# the reaper's CANCEL_ORPHANED_RUNS) and its high-water mark is still past
# them: left so, the materializer would resume beyond them and a horizon of
# instants would stay cancelled while the job is in the config. So the rows of
# instants still ahead that the removal cancelled (and any not started) are
# deleted, and planning starts again from now, as after a schedule change (the
# materializer plans them again, with the definition now in the config). The
# instants that came due while the job was out of the config keep their
# cancelled rows; none is planned for the time it was gone. An operator's
# cancel of a future run has another reason and stays.
RESTORE_READDED_JOB = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM job_runs
     WHERE job_id = $1 AND trigger = 'schedule' AND scheduled_at > now()
       AND (state IN ('pending', 'claimed') OR (state = 'cancelled' AND error = $2))
     ORDER BY id
       FOR UPDATE
),
gone AS (
    DELETE FROM job_runs r USING doomed d
     WHERE r.id = d.id AND r.scheduled_at > now()
       AND (r.state IN ('pending', 'claimed') OR (r.state = 'cancelled' AND r.error = $2))
    RETURNING 1
)
UPDATE jobs SET materialized_until = now(), planned_since = now() WHERE id = $1
RETURNING (SELECT count(*) FROM gone) AS restored
"""
# The jobs a sync is about to disable (their rows locked by LOCK_JOBS_FOR_SYNC,
# so no tick moves their marks meanwhile), with what planning them up to the
# removal needs: the instants that came due since the last plan (after a
# re-add a moment ago, no tick may have reached them) get their rows before
# DISABLE_REMOVED_JOBS, which cancels them with the others not started. Paused
# jobs are not planned (the materializer plans none while paused), nor are the
# usual ones, whose mark is already ahead of now: a removal of many jobs reads
# only the few planned short of it.
REMOVED_JOBS_TO_PLAN = """
SELECT id, name, definition, materialized_until, created_at, now() AS now
  FROM jobs
 WHERE id = ANY ($1::bigint[]) AND enabled AND NOT paused
   AND (materialized_until IS NULL OR materialized_until < now())
"""
# Those instants' rows and the marks that now reach the removal; a row already
# written (by a tick just before) stays as it is.
INSERT_RUNS_UNTIL_REMOVAL = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[])
ON CONFLICT ON CONSTRAINT job_runs_one_row_per_instant DO NOTHING
"""
ADVANCE_MARKS_TO_REMOVAL = """
UPDATE jobs j SET materialized_until = GREATEST(COALESCE(j.materialized_until, u.until), u.until)
  FROM unnest($1::bigint[], $2::timestamptz[]) AS u(id, until)
 WHERE j.id = u.id
"""
# The enabled jobs a sync will disable: gone from the config (and not kept).
REMOVED_JOBS = "SELECT name FROM jobs WHERE enabled AND NOT (name = ANY($1::text[]))"
# Moves whenever the catalog changes what a materializer plans (sql/0009): a
# materializer reads the whole catalog again only then.
CATALOG_VERSION = "SELECT version FROM job_catalog_version"
# No definition: it comes from actors/adapters/postgres/stored_definitions.py,
# read once per fingerprint (it was most of this statement's cost).
ACTIVE_JOBS = """
SELECT id, name, materialized_until, paused, fingerprint, created_at
  FROM jobs WHERE enabled
"""
# The one clock: every replica plans on the database's now(), never its own.
DATABASE_NOW = "SELECT now()"
# The status page's job list: each job's pending count and latest success.
# The jobs the config file rejected, as the last load found them (sql/0011):
# replaced as a whole, in one transaction, so a reader never sees half of two
# loads. A load with no rejected job leaves the table empty.
CLEAR_REJECTED_JOBS = "DELETE FROM config_rejected_jobs"
RECORD_REJECTED_JOBS = """
INSERT INTO config_rejected_jobs (job, path, field, error, replica)
SELECT u.job, u.path, u.field, u.error, $5
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(job, path, field, error)
ON CONFLICT (job) DO UPDATE SET path = EXCLUDED.path, field = EXCLUDED.field,
                                error = EXCLUDED.error, replica = EXCLUDED.replica,
                                recorded_at = now()
"""

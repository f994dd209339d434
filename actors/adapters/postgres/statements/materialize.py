"""Writing planned runs: idempotent inserts behind a fenced high-water mark."""

# Idempotent by the unique constraint: any number of replicas may materialize
# the same instants; the second insert of (job, instant) changes nothing.
#
# A plan is written only while the job's definition is the one it was made
# from, and only from the high-water mark it was made from. The guarded UPDATE
# of the high-water mark runs first, in the same transaction, and row-locks
# each job whose fingerprint and mark still match; the insert then writes only
# for those jobs. A reload's UPSERT of the same job row
# waits for that lock, so its withdrawal of future runs sees (and deletes) the
# rows written here; a plan from a superseded definition writes nothing.
#
# A plan is also written only while it is fresh on the database's clock ($4:
# the now() it was planned at plus its on-time tolerance). A plan that waited
# longer (a stalled replica) would keep as "late" instants that every fresh
# plan counts as missed; it writes nothing, and the next tick plans again.
#
# The job rows are locked in id order first, as every statement that changes
# several job rows does (see "row locks" above, and LOCK_JOBS_FOR_SYNC): the
# UPDATE alone locks them in whatever order its plan visits them, so two
# replicas (or a reload) listing the jobs in different orders could deadlock.
ADVANCE_HIGH_WATER = """
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $5::timestamptz[])
        AS u(id, until, fingerprint, planned_from)
),
locked AS MATERIALIZED (
    SELECT j.id, u.until, u.fingerprint, u.planned_from FROM jobs j JOIN u ON u.id = j.id
     WHERE j.id = ANY ($1::bigint[]) ORDER BY j.id FOR NO KEY UPDATE OF j
)
UPDATE jobs j SET materialized_until = GREATEST(COALESCE(j.materialized_until, l.until), l.until)
  FROM locked l
 WHERE j.id = l.id AND j.fingerprint = l.fingerprint AND j.enabled
   AND j.materialized_until IS NOT DISTINCT FROM l.planned_from
   AND ($4::timestamptz IS NULL OR now() <= $4::timestamptz)
RETURNING j.id
"""
# A plan is written only from the mark it was planned from ($5): a replica
# whose copy of the mark is behind (another replica planned the job since)
# writes nothing for that job and reads the current mark (CURRENT_MARKS)
# instead. Without the comparison a stale copy would call instants missed that
# another replica already wrote, and record a gap beside their rows. A plan
# refused because the job was disabled or its definition changed since it was
# read (a reload) is superseded, not moved: the fingerprint and enabled flag
# tell them apart, and the materializer reads the catalog again for it.
CURRENT_MARKS = """
SELECT id, materialized_until, fingerprint, enabled FROM jobs WHERE id = ANY ($1::bigint[])
"""
# Whether a plan of the database's now() minus its on-time tolerance is still
# fresh: now() is the transaction's start, the same for every statement in it.
PLAN_IS_FRESH = "SELECT $1::timestamptz IS NULL OR now() <= $1::timestamptz"
INSERT_PLANNED_RUNS = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT u.job_id, u.scheduled_at, u.due_at
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[])
       AS u(job_id, scheduled_at, due_at)
 WHERE u.job_id = ANY ($4::bigint[])
ON CONFLICT ON CONSTRAINT job_runs_one_row_per_instant DO NOTHING
"""

"""The reaper's statements: find expired leases, then apply each run's verdict."""

# fmt: off
# SQL keeps its hand layout here: the formatter would split the spliced
# constants across lines and separate each noqa from the line it covers.

from actors.adapters.postgres.statements.row_rules import LEASE_EXPIRED

# A lease that expired while claimed means the run never started: back to
# pending, same attempt. One that expired while running lost its worker: the
# attempt is over (recorded as lease_expired), and the run is retried or, at
# the job's attempt limit, failed. Which of these is decided in Python, by
# actors.domain.decide_attempt, between the two statements below, in one
# transaction. SKIP LOCKED: the reaper never waits for a row lock (see "row
# locks" in the package's docstring); what it judges is the row as it locked
# it, and the lock is held until the verdict is applied.
LOCK_EXPIRED_LEASES = """
SELECT r.id::text AS id, r.state, r.attempt, r.claim_epoch, r.lease_owner, r.started_at,
       j.max_attempts, j.name
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE """ + LEASE_EXPIRED + """
 ORDER BY r.lease_expires_at
   FOR UPDATE OF r SKIP LOCKED
 LIMIT $1
"""
# A verdict of actors.domain.decide_attempt applied to run ``r`` (its row ``v``:
# state, next_attempt, due_s): here and in the worker's APPLY_INTERRUPTED. A run
# back to pending is due again after due_s; any other state is final, finished now.
SET_VERDICT = """SET state = v.state,
           attempt = v.next_attempt,
           due_at = COALESCE(now() + make_interval(secs => v.due_s), r.due_at),
           finished_at = CASE WHEN v.state = 'pending' THEN NULL ELSE now() END"""

# The verdicts, one row each: the run's next state, attempt and due delay;
# for a run that was running, the lost attempt is recorded with its worker.
APPLY_REAPED = """
WITH v AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::float8[], $5::boolean[],
                         $6::int[], $7::bigint[], $8::text[], $9::timestamptz[])
        AS v(id, state, next_attempt, due_s, lost, attempt, epoch, owner, started_at)
),
reaped AS (
    UPDATE job_runs r
       """ + SET_VERDICT + """,
           outcome = CASE WHEN v.lost THEN 'lease_expired' ELSE r.outcome END,
           error = CASE WHEN v.lost THEN 'lease expired on ' || v.owner ELSE r.error END,
           started_at = NULL, claimed_at = NULL, lease_owner = NULL, lease_expires_at = NULL,
           updated_at = now()
      FROM v
     WHERE r.id = v.id
    RETURNING r.id
)
INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome, error)
SELECT v.id, v.attempt, v.epoch, v.owner, v.started_at, 'lease_expired',
       'lease expired on ' || v.owner
  FROM v JOIN reaped ON reaped.id = v.id
 WHERE v.lost
ON CONFLICT DO NOTHING
"""  # noqa: S608 - spliced from a constant, never from input

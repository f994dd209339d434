"""The reaper's statement: expired leases back to pending, or failed."""

# A lease that expired while claimed means the run never started: back to
# pending, same attempt. One that expired while running lost its worker: the
# attempt is over (recorded as lease_expired), and the run is retried or, at
# the job's attempt limit, failed. SKIP LOCKED: the reaper never waits for a
# row lock (see "row locks" above); what it judges is the row as it locked it.
REAP_EXPIRED_LEASES = """
WITH expired AS (
    SELECT id, job_id, state, attempt, claim_epoch, lease_owner, started_at FROM job_runs
     WHERE state IN ('claimed', 'running') AND lease_expires_at < now()
     ORDER BY lease_expires_at
       FOR UPDATE SKIP LOCKED
     LIMIT $1
),
prior AS (
    SELECT e.id, e.state, e.attempt, e.claim_epoch, e.lease_owner, e.started_at,
           j.max_attempts, j.name
      FROM expired e JOIN jobs j ON j.id = e.job_id
),
reaped AS (
    UPDATE job_runs r
       SET state = CASE WHEN p.state = 'running' AND p.attempt >= p.max_attempts
                        THEN 'failed' ELSE 'pending' END,
           attempt = CASE WHEN p.state = 'running' AND p.attempt < p.max_attempts
                          THEN r.attempt + 1 ELSE r.attempt END,
           finished_at = CASE WHEN p.state = 'running' AND p.attempt >= p.max_attempts
                              THEN now() END,
           outcome = CASE WHEN p.state = 'running' THEN 'lease_expired' ELSE r.outcome END,
           error = CASE WHEN p.state = 'running'
                        THEN 'lease expired on ' || p.lease_owner ELSE r.error END,
           started_at = NULL, claimed_at = NULL, lease_owner = NULL, lease_expires_at = NULL,
           updated_at = now()
      FROM prior p
     WHERE r.id = p.id
    RETURNING r.id, r.state
),
lost AS (
    INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome,
                                  error)
    SELECT p.id, p.attempt, p.claim_epoch, p.lease_owner, p.started_at, 'lease_expired',
           'lease expired on ' || p.lease_owner
      FROM prior p WHERE p.state = 'running'
    ON CONFLICT DO NOTHING
)
SELECT reaped.id::text AS id, p.name, p.state AS from_state, reaped.state AS to_state
  FROM reaped JOIN prior p ON p.id = reaped.id
"""

-- The policy statements (overlap, start deadline, catch-up) are driven from
-- the jobs that have a policy, one index range per job, so their cost follows
-- the number of jobs, not the size of the due backlog.
CREATE INDEX job_runs_pending_by_job ON job_runs (job_id, scheduled_at) WHERE state = 'pending';
CREATE INDEX job_runs_active_by_job ON job_runs (job_id) WHERE state IN ('claimed', 'running');

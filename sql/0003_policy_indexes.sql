-- The policy statements (overlap, start deadline, catch-up) are driven from
-- the jobs that have a policy, one index range per job, so their cost follows
-- the number of jobs, not the size of the due backlog.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: job_runs IN SHARE MODE
CREATE INDEX job_runs_pending_by_job ON job_runs (job_id, scheduled_at) WHERE state = 'pending';
CREATE INDEX job_runs_active_by_job ON job_runs (job_id) WHERE state IN ('claimed', 'running');

-- The cluster-wide "last success / last failure" gauges (actors/cluster_metrics.py)
-- read each job's latest finished run in a state on every scrape: with this index
-- that is one index probe per job, not a scan of the job's whole history.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: job_runs IN SHARE MODE
CREATE INDEX job_runs_job_last_finished ON job_runs (job_id, state, finished_at DESC)
    WHERE state IN ('succeeded', 'failed');

-- Per-tick statements touch only the rows that can change their answer, not
-- every pending row of the horizon (jobs x horizon) nor every job.
--
-- The skip pass's start-deadline branch walks the first scheduled attempts in
-- instant order, from the oldest, and stops at now() - (the shortest deadline):
-- it reads the runs past some deadline, never the future horizon.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN SHARE MODE
-- lock: job_runs IN SHARE MODE
CREATE INDEX job_runs_pending_first_scheduled ON job_runs (scheduled_at, job_id)
    WHERE state = 'pending' AND trigger = 'schedule' AND attempt = 1;
-- The shortest start deadline of the jobs that are claimed, one index probe.
CREATE INDEX jobs_start_deadline ON jobs (start_deadline)
    WHERE enabled AND NOT paused AND start_deadline IS NOT NULL;
-- The jobs each policy statement is about, found without a scan of jobs (whose
-- rows the materializer rewrites every tick): usually none of them.
CREATE INDEX jobs_exclusive ON jobs (id) WHERE enabled AND NOT paused AND overlap <> 'allow';
CREATE INDEX jobs_forbid ON jobs (id) WHERE enabled AND NOT paused AND overlap = 'forbid';
CREATE INDEX jobs_latest ON jobs (id) WHERE enabled AND NOT paused AND catchup = 'latest';
CREATE INDEX jobs_disabled ON jobs (id) WHERE NOT enabled;

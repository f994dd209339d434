-- A run's own overlap mode, chosen by the operator who added it (`claimd backfill
-- --overlap`, `claimd trigger --overlap`); NULL: the job's. It only refines a job
-- whose overlap is forbid or queue (the claim and the skip pass read it there);
-- a job with overlap = allow runs every run as allow:
--   queue:  waits until no other run of the job is active, then runs (the default
--           for an operator's runs of a forbid or queue job: a backfill of 24
--           instants runs 24 times, one after another);
--   forbid: skipped, with the reason, if another run is active when it is due;
--   allow:  runs beside any other run of the job.
-- Nullable with no default: adding it rewrites nothing.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: job_runs IN ACCESS EXCLUSIVE MODE
ALTER TABLE job_runs
    ADD COLUMN overlap text CHECK (overlap IN ('allow', 'forbid', 'queue'));

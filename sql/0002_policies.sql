-- Scheduling policies the claimer enforces in the database, so that they hold
-- across replicas whatever the races.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN ACCESS EXCLUSIVE MODE
-- lock: job_runs IN ACCESS EXCLUSIVE MODE

ALTER TABLE jobs
    ADD COLUMN overlap text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'forbid', 'queue')),
    ADD COLUMN catchup text NOT NULL DEFAULT 'all' CHECK (catchup IN ('all', 'latest', 'none')),
    -- A first attempt not started by scheduled_at + start_deadline is skipped.
    ADD COLUMN start_deadline interval;

ALTER TABLE job_runs
    -- Set at claim for runs of forbid/queue jobs: the index below then lets at
    -- most one of them be claimed or running per job, enforced by PostgreSQL.
    ADD COLUMN exclusive boolean NOT NULL DEFAULT false;

CREATE UNIQUE INDEX job_runs_one_active_exclusive ON job_runs (job_id)
    WHERE exclusive AND state IN ('claimed', 'running');

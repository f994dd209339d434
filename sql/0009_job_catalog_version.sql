-- A number that changes whenever the job catalog changes in a way that alters
-- what a materializer plans: a job added, removed or re-enabled, its
-- definition edited, paused or resumed, or its plan withdrawn (planned_since).
-- A materializer keeps every job it plans in memory and reads this one row
-- each tick; it reads the whole catalog again only when the number moved. At
-- 100,000 jobs that is one indexed row a second instead of every job.
--
-- A statement-level trigger, so that no statement has to remember to bump it.
-- The high-water mark (materialized_until alone) is not watched: it moves on
-- every plan, and a materializer whose copy of a mark is behind learns the
-- current one from the refused write (ADVANCE_HIGH_WATER compares the mark).
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN SHARE ROW EXCLUSIVE MODE
CREATE TABLE job_catalog_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL
);
INSERT INTO job_catalog_version (version) VALUES (1);

CREATE FUNCTION claimd_job_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_catalog_version SET version = version + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_catalog_changed
    AFTER INSERT OR DELETE OR UPDATE OF definition, fingerprint, enabled, paused, created_at,
                                         planned_since
    ON jobs FOR EACH STATEMENT EXECUTE FUNCTION claimd_job_catalog_changed();
CREATE TRIGGER jobs_catalog_truncated
    AFTER TRUNCATE ON jobs FOR EACH STATEMENT EXECUTE FUNCTION claimd_job_catalog_changed();

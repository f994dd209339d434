-- Each attempt keeps its own output tail (what a shell or python job printed
-- and logged, secrets scrubbed), so a retry no longer hides what the attempt
-- before it said. job_runs.output_tail stays: the latest attempt's.
-- Rows written before this migration have none (NULL).
--
-- Adding a nullable column without a default only touches the catalog.
-- lock: job_run_attempts IN ACCESS EXCLUSIVE MODE
ALTER TABLE job_run_attempts ADD COLUMN output_tail text;

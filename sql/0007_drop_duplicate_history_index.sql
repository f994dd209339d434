-- job_runs_job_scheduled (job_id, scheduled_at DESC) duplicated the unique
-- index of job_runs_one_row_per_instant (job_id, scheduled_at): a B-tree is
-- read backwards as cheaply as forwards, so every plan that used it (history
-- pages, the `latest` judgement, the newest instant of a job) uses the unique
-- index instead. Every row version a claim, start or completion writes is
-- inserted into each index over the whole history; one fewer of them is less
-- work per run that grows with the history.
DROP INDEX job_runs_job_scheduled;

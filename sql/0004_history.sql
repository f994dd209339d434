-- History without silent holes, and who did what.
--
-- Every instant a schedule makes due is accounted for: a job_runs row, or,
-- where the catch-up policy dropped it, a gap recorded here in the same
-- transaction as the plan that dropped it. `claimd audit` reads both.
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: jobs IN ACCESS EXCLUSIVE MODE

CREATE TABLE job_run_gaps (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint      NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    from_at     timestamptz NOT NULL,   -- first dropped instant
    to_at       timestamptz NOT NULL,   -- last dropped instant
    count       bigint      NOT NULL CHECK (count >= 1),  -- instants of the schedule in between
    reason      text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_run_gaps_ordered CHECK (from_at <= to_at)
);
CREATE INDEX job_run_gaps_by_job ON job_run_gaps (job_id, from_at);

-- Where the job's current schedule began to be planned, when that is not its
-- creation (a new job is planned from created_at): a changed schedule starts
-- again from the change. Instants before it were never due.
ALTER TABLE jobs ADD COLUMN planned_since timestamptz;

-- Every operator action, whoever asked and however (CLI, HTTP API, signal).
CREATE TABLE operator_actions (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,   -- OS user or --actor (CLI), token name (API)
    via       text        NOT NULL CHECK (via IN ('cli', 'http', 'signal')),
    origin    text,                   -- host and pid, or the client's address
    action    text        NOT NULL,   -- pause | resume | trigger | cancel | backfill | reload
    job       text,
    run_id    uuid,
    arguments jsonb       NOT NULL DEFAULT '{}',
    ok        boolean     NOT NULL,   -- false: refused (unknown job, nothing to do, ...)
    result    text        NOT NULL
);
CREATE INDEX operator_actions_at ON operator_actions (at DESC);

-- claimd schema, version 1.
-- Names are unqualified: the schema is chosen by search_path, so tests and
-- deployments can each live in their own schema.

CREATE TABLE jobs (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name               text        NOT NULL UNIQUE,
    definition         jsonb       NOT NULL,   -- what workers execute; only ever written from the config file
    fingerprint        text        NOT NULL,   -- changes when the definition changes
    enabled            boolean     NOT NULL DEFAULT true,   -- false once removed from the config file
    paused             boolean     NOT NULL DEFAULT false,  -- operator action
    max_attempts       integer     NOT NULL CHECK (max_attempts >= 1),
    materialized_until timestamptz,            -- high-water mark of the materializer
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE job_runs (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),  -- the idempotency key
    job_id           bigint      NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    scheduled_at     timestamptz NOT NULL,     -- the instant the schedule names
    due_at           timestamptz NOT NULL,     -- when it may next be claimed (jitter, retry backoff)
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'running', 'succeeded',
                                      'failed', 'skipped', 'cancelled')),
    trigger          text        NOT NULL DEFAULT 'schedule'
                     CHECK (trigger IN ('schedule', 'manual', 'backfill')),
    attempt          integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    claim_epoch      bigint      NOT NULL DEFAULT 0,  -- fencing token: +1 on every claim
    lease_owner      text,
    lease_expires_at timestamptz,
    claimed_at       timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    outcome          text,       -- succeeded | failed | timed_out | cancelled | lease_expired | ...
    exit_code        integer,
    error            text,
    output_tail      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- The promise "no double record": one row per job and instant, whoever writes it.
    CONSTRAINT job_runs_one_row_per_instant UNIQUE (job_id, scheduled_at),
    CONSTRAINT job_runs_lease_held CHECK (
        (state IN ('claimed', 'running')) = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);

-- The claim touches only pending rows, in due order: the index stays the size
-- of the backlog, not of the history.
CREATE INDEX job_runs_pending_due ON job_runs (due_at) WHERE state = 'pending';
-- The reaper and the claimer's in-flight bound look only at leased rows.
CREATE INDEX job_runs_leased ON job_runs (lease_expires_at) WHERE state IN ('claimed', 'running');
-- History pages and retention.
CREATE INDEX job_runs_job_scheduled ON job_runs (job_id, scheduled_at DESC);
CREATE INDEX job_runs_finished ON job_runs (finished_at) WHERE finished_at IS NOT NULL;

-- One row per execution attempt that reached a verdict: the history an
-- operator reads ("failed twice, then succeeded") and the harness checks.
CREATE TABLE job_run_attempts (
    run_id      uuid        NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    claim_epoch bigint      NOT NULL,
    worker      text,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    exit_code   integer,
    error       text,
    PRIMARY KEY (run_id, claim_epoch)
);

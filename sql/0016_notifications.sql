-- Notifications: one per (run, event, sink), whatever the replicas do.
--
-- notify_policies holds each job's notification policy as the config file in
-- force says it (written by the replicas at start and reload). The verdicts
-- that may cause a notification (failed: no attempt left; recovered: the first
-- success after a notified failure) are noted in the verdict's own transaction
-- by the trigger below, and judged into outbox rows by a notifier. missed and
-- too_long are found by a periodic scan any replica may run. The unique key
-- (run_id, event, sink) makes every writer idempotent: a second scan, a
-- second replica, a retried statement insert nothing.
--
-- The outbox is claimed like runs are (FOR UPDATE SKIP LOCKED, a lease, an
-- epoch that fences a sender whose lease expired) and every attempt to send is
-- recorded (notification_attempts), including one whose sender died while
-- sending (outcome 'lost', written when its lease is recovered).
--
-- Taken before the statements, in one order, with a short lock_timeout and
-- retries (actors/adapters/postgres/migrations.py):
-- lock: job_runs IN SHARE ROW EXCLUSIVE MODE

CREATE TABLE notify_policies (
    job_name          text        PRIMARY KEY,
    sinks             text[]      NOT NULL,
    events            text[]      NOT NULL,
    failure_tolerance integer     NOT NULL DEFAULT 1 CHECK (failure_tolerance >= 1),
    realert           interval,              -- NULL: one failed notification per failing streak
    deadline          interval,              -- missed: no success this long after the instant
    too_long          interval,              -- too_long: still running this long after its start
    since             timestamptz NOT NULL DEFAULT now(),  -- instants before it are not judged
    missed_until      timestamptz,           -- the missed scan judged every instant up to here
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Per job: the failing streak and whether it was notified (what recovered needs).
CREATE TABLE notify_job_state (
    job_name             text        PRIMARY KEY,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    alerted              boolean     NOT NULL DEFAULT false,
    last_alert_at        timestamptz
);

CREATE TABLE notification_outbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           uuid        NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    job_name         text        NOT NULL,
    event            text        NOT NULL CHECK (event IN ('failed', 'recovered', 'missed', 'too_long')),
    sink             text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'sending', 'sent', 'dead')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    due_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,
    claim_epoch      bigint      NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    sent_at          timestamptz,
    last_error       text,
    -- The promise: one notification per run, event and sink.
    CONSTRAINT notification_outbox_once UNIQUE (run_id, event, sink),
    CONSTRAINT notification_outbox_lease_held CHECK (
        (state = 'sending') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);
CREATE INDEX notification_outbox_due ON notification_outbox (due_at) WHERE state = 'pending';
CREATE INDEX notification_outbox_leased ON notification_outbox (lease_expires_at)
    WHERE state = 'sending';
CREATE INDEX notification_outbox_created ON notification_outbox (created_at DESC);

CREATE TABLE notification_attempts (
    outbox_id   bigint      NOT NULL REFERENCES notification_outbox (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    claim_epoch bigint      NOT NULL,
    sender      text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    outcome     text        NOT NULL DEFAULT 'sending'
                CHECK (outcome IN ('sending', 'delivered', 'failed', 'lost')),
    status      integer,    -- HTTP status or SMTP reply code
    reply       text,       -- the first bytes of the answer
    error       text,
    PRIMARY KEY (outbox_id, attempt)
);

-- Verdicts a notification may follow, noted in the verdict's own transaction
-- (whichever path records it: a worker's completion, the reaper's last expired
-- lease): a verdict recorded is a verdict judged, a verdict rolled back is none.
-- Judged shortly after by a notifier (actors/domain/notify.py: judge_verdict),
-- which locks the jobs' streaks in name order: the trigger itself takes no lock
-- a completion batch could take in another order (the row-lock rule of
-- statements/__init__.py), only an insert.
CREATE TABLE notify_verdicts (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   uuid        NOT NULL,
    job_name text        NOT NULL,
    state    text        NOT NULL CHECK (state IN ('failed', 'succeeded')),
    at       timestamptz NOT NULL DEFAULT now()
);

-- Only an UPDATE that turns a run failed or succeeded calls it (the WHEN is checked
-- without calling the function); a job without a policy costs two index lookups.
CREATE FUNCTION claimd_notify_verdict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notify_verdicts (run_id, job_name, state)
    SELECT NEW.id, j.name, NEW.state
      FROM jobs j JOIN notify_policies p ON p.job_name = j.name
     WHERE j.id = NEW.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_runs_notify_verdict AFTER UPDATE OF state ON job_runs
    FOR EACH ROW
    WHEN (NEW.state IN ('failed', 'succeeded') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION claimd_notify_verdict();

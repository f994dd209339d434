"""The notification outbox's statements (schema and trigger: sql/0016_notifications.sql).

failed and recovered rows are written by the trigger, in the verdict's own
transaction; missed and too_long by the scans below, which any replica may run
at once: the unique key (run_id, event, sink) makes a second writer a no-op.
The outbox is claimed like runs are: ORDER BY inside the locking select, SKIP
LOCKED, a lease and an epoch that fences a sender whose lease was recovered.
"""

# The policies of this replica's config, written where they differ; the policies of
# jobs it does not have are removed. Sinks and events travel comma-joined (their
# names cannot hold a comma) because unnest cannot take an array of arrays.
SYNC_POLICIES = """
WITH v AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[],
                         $5::float8[], $6::float8[], $7::float8[])
        AS v(job_name, sinks, events, tolerance, realert_s, deadline_s, too_long_s)
),
gone AS (
    DELETE FROM notify_policies p
     WHERE NOT EXISTS (SELECT 1 FROM v WHERE v.job_name = p.job_name)
    RETURNING 1
)
INSERT INTO notify_policies AS p
       (job_name, sinks, events, failure_tolerance, realert, deadline, too_long)
SELECT job_name, string_to_array(sinks, ','), string_to_array(events, ','), tolerance,
       make_interval(secs => realert_s), make_interval(secs => deadline_s),
       make_interval(secs => too_long_s)
  FROM v
    ON CONFLICT (job_name) DO UPDATE
   SET sinks = EXCLUDED.sinks, events = EXCLUDED.events,
       failure_tolerance = EXCLUDED.failure_tolerance, realert = EXCLUDED.realert,
       deadline = EXCLUDED.deadline, too_long = EXCLUDED.too_long, updated_at = now()
 WHERE (p.sinks, p.events, p.failure_tolerance, p.realert, p.deadline, p.too_long)
       IS DISTINCT FROM (EXCLUDED.sinks, EXCLUDED.events, EXCLUDED.failure_tolerance,
                         EXCLUDED.realert, EXCLUDED.deadline, EXCLUDED.too_long)
"""

# missed: each instant judged once its deadline passed (from the policy's watermark
# on, so a tick costs the instants that reached their deadline since the last one;
# $1: how far back past a deadline a cluster that was down still looks). A failed
# run says failed, a cancelled one was the operator's doing: neither is missed.
SCAN_MISSED = """
WITH p AS (
    SELECT job_name, sinks, deadline,
           greatest(since, coalesce(missed_until, since),
                    now() - deadline - make_interval(secs => $1)) AS from_at
      FROM notify_policies
     WHERE 'missed' = ANY (events) AND deadline IS NOT NULL
),
found AS (
    INSERT INTO notification_outbox (run_id, job_name, event, sink)
    SELECT r.id, p.job_name, 'missed', s.sink
      FROM p
      JOIN jobs j ON j.name = p.job_name
      JOIN job_runs r ON r.job_id = j.id
                     AND r.scheduled_at > p.from_at
                     AND r.scheduled_at <= now() - p.deadline
     CROSS JOIN LATERAL unnest(p.sinks) AS s(sink)
     WHERE r.trigger = 'schedule'
       AND r.state NOT IN ('failed', 'cancelled')
       AND NOT (r.state = 'succeeded' AND r.finished_at <= r.scheduled_at + p.deadline)
        ON CONFLICT DO NOTHING
    RETURNING id
),
moved AS (
    -- The mark moves only once it lags a minute: rewriting every policy row at
    -- every scan (each replica, every 5 s) was 100,000 row versions a scan at
    -- 100,000 jobs. A lagging mark only widens the window scanned again, and
    -- the outbox's UNIQUE (run_id, event, sink) makes that a no-op (a pruned run
    -- takes its outbox rows with it, so nothing is sent twice).
    UPDATE notify_policies np
       SET missed_until = greatest(coalesce(np.missed_until, np.since), now() - np.deadline)
      FROM p
     WHERE np.job_name = p.job_name
       AND (np.missed_until IS NULL
            OR np.missed_until < now() - np.deadline - interval '60 seconds')
    RETURNING 1
)
SELECT count(*) FROM found
"""

# too_long: a run still running past its job's bound (the leased rows' index).
SCAN_TOO_LONG = """
INSERT INTO notification_outbox (run_id, job_name, event, sink)
SELECT r.id, p.job_name, 'too_long', s.sink
  FROM notify_policies p
  JOIN jobs j ON j.name = p.job_name
  JOIN job_runs r ON r.job_id = j.id AND r.state = 'running'
                 AND r.started_at <= now() - p.too_long
 CROSS JOIN LATERAL unnest(p.sinks) AS s(sink)
 WHERE p.too_long IS NOT NULL AND 'too_long' = ANY (p.events)
    ON CONFLICT DO NOTHING
RETURNING id
"""

# A sender that died (or stalled past its lease) while sending: its row goes back to
# pending (or dead at the attempt limit, $1), and its attempt is recorded as lost:
# nobody knows whether the receiver got it (the delivery id lets the receiver dedupe).
RECOVER_EXPIRED = """
WITH expired AS (
    UPDATE notification_outbox o
       SET state = CASE WHEN o.attempts >= $1 THEN 'dead' ELSE 'pending' END,
           lease_owner = NULL, lease_expires_at = NULL, due_at = now(),
           last_error = 'the sender stopped before it recorded an answer'
     WHERE o.id IN (SELECT id FROM notification_outbox
                     WHERE state = 'sending' AND lease_expires_at < now()
                     ORDER BY lease_expires_at
                       FOR UPDATE SKIP LOCKED
                     LIMIT 100)
    RETURNING o.id, o.claim_epoch
),
lost AS (
    UPDATE notification_attempts a
       SET outcome = 'lost', finished_at = now(),
           error = 'the sender stopped before it recorded an answer (its lease expired); '
                   'the receiver may have got it'
      FROM expired e
     WHERE a.outbox_id = e.id AND a.claim_epoch = e.claim_epoch AND a.outcome = 'sending'
    RETURNING 1
)
SELECT count(*) FROM expired
"""

# ORDER BY inside the locking select (as the runs' claim): the oldest due first,
# whatever order RETURNING gives. Each claim opens its attempt's record.
CLAIM_NOTIFICATIONS = """
WITH c AS (
    SELECT id FROM notification_outbox
     WHERE state = 'pending' AND due_at <= now()
     ORDER BY due_at
       FOR UPDATE SKIP LOCKED
     LIMIT $2
),
claimed AS (
    UPDATE notification_outbox o
       SET state = 'sending', lease_owner = $1,
           lease_expires_at = now() + make_interval(secs => $3),
           claim_epoch = o.claim_epoch + 1, attempts = o.attempts + 1
      FROM c
     WHERE o.id = c.id
    RETURNING o.id, o.run_id, o.job_name, o.event, o.sink, o.attempts, o.claim_epoch
),
noted AS (
    INSERT INTO notification_attempts (outbox_id, attempt, claim_epoch, sender)
    SELECT id, attempts, claim_epoch, $1 FROM claimed
    RETURNING 1
)
SELECT c.id, c.run_id::text AS run_id, c.job_name, c.event, c.sink, c.attempts, c.claim_epoch,
       r.scheduled_at, r.state AS run_state, r.attempt AS run_attempt, r.outcome, r.error,
       r.exit_code, r.started_at, r.finished_at
  FROM claimed c JOIN job_runs r ON r.id = c.run_id
"""

# One attempt's answer. The attempt is recorded whatever happened to the lease; the
# row moves only while this sender still holds it (owner and epoch): delivered -> sent;
# failed -> pending after the backoff ($8 s), or dead at the attempt limit ($9).
RECORD_ATTEMPT = """
WITH done AS (
    UPDATE notification_outbox
       SET state = CASE WHEN $4 THEN 'sent' WHEN attempts >= $9 THEN 'dead' ELSE 'pending' END,
           sent_at = CASE WHEN $4 THEN now() END,
           due_at = CASE WHEN $4 THEN due_at ELSE now() + make_interval(secs => $8) END,
           last_error = CASE WHEN $4 THEN NULL ELSE $7 END,
           lease_owner = NULL, lease_expires_at = NULL
     WHERE id = $1 AND claim_epoch = $2 AND state = 'sending' AND lease_owner = $3
    RETURNING state
),
noted AS (
    UPDATE notification_attempts
       SET outcome = CASE WHEN $4 THEN 'delivered' ELSE 'failed' END,
           finished_at = now(), status = $5, reply = $6, error = $7
     WHERE outbox_id = $1 AND claim_epoch = $2
    RETURNING 1
)
SELECT (SELECT state FROM done) AS state
"""

OUTBOX_FIGURES = """
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_s,
       count(*) FILTER (WHERE state = 'sending') AS sending
  FROM notification_outbox
 WHERE state IN ('pending', 'sending')
"""

COUNT_DEAD = "SELECT count(*) FROM notification_outbox WHERE state = 'dead'"

# The newest notifications ($1: a job or NULL; $2: how many), each with its attempts.
LIST_NOTIFICATIONS = """
WITH o AS (
    SELECT * FROM notification_outbox
     WHERE $1::text IS NULL OR job_name = $1
     ORDER BY created_at DESC, id DESC
     LIMIT $2
)
SELECT o.id, o.created_at, o.job_name, o.run_id::text AS run_id, o.event, o.sink, o.state,
       o.attempts, o.sent_at, o.due_at, o.last_error,
       coalesce(
           (SELECT json_agg(json_build_object(
                       'attempt', a.attempt, 'started_at', a.started_at,
                       'finished_at', a.finished_at, 'outcome', a.outcome,
                       'status', a.status, 'reply', a.reply, 'error', a.error,
                       'sender', a.sender) ORDER BY a.attempt)
              FROM notification_attempts a WHERE a.outbox_id = o.id),
           '[]'::json)::text AS attempts_json
  FROM o
 ORDER BY o.created_at DESC, o.id DESC
"""

# --- judging the verdicts the trigger noted (one transaction; see sql/0016) ---------------
# One judge at a time in the schema (a transaction's advisory lock, tried, never waited
# for): a job's verdicts are judged in the order they were noted, whoever judges them.
TRY_JUDGE_LOCK = (
    "SELECT pg_try_advisory_xact_lock(hashtext('claimd.notify.judge:' || current_schema()))"
)
# The oldest noted verdicts, locked without waiting (another notifier takes the next ones).
LOCK_VERDICTS = """
SELECT id, run_id::text AS run_id, job_name, state
  FROM notify_verdicts
 ORDER BY id
   FOR UPDATE SKIP LOCKED
 LIMIT $1
"""
# The jobs' streaks, created if new and locked in name order: two notifiers judging
# verdicts of the same jobs wait for each other, never in a cycle.
ENSURE_STREAKS = """
INSERT INTO notify_job_state (job_name)
SELECT name FROM unnest($1::text[]) AS n(name) ORDER BY name
    ON CONFLICT DO NOTHING
"""
LOCK_STREAKS = """
SELECT job_name, consecutive_failures, alerted, last_alert_at
  FROM notify_job_state
 WHERE job_name = ANY ($1::text[])
 ORDER BY job_name
   FOR UPDATE
"""
POLICIES_OF = """
SELECT job_name, sinks, events, failure_tolerance, realert, deadline, too_long, now() AS now
  FROM notify_policies
 WHERE job_name = ANY ($1::text[])
"""
# The events owed, one row per sink; a run pruned meanwhile owes nothing.
INSERT_OWED = """
INSERT INTO notification_outbox (run_id, job_name, event, sink)
SELECT o.run_id, o.job_name, o.event, o.sink
  FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS o(run_id, job_name, event, sink)
  JOIN job_runs r ON r.id = o.run_id
    ON CONFLICT DO NOTHING
"""
UPDATE_STREAKS = """
UPDATE notify_job_state s
   SET consecutive_failures = v.failures, alerted = v.alerted, last_alert_at = v.last_alert_at
  FROM unnest($1::text[], $2::int[], $3::boolean[], $4::timestamptz[])
       AS v(job_name, failures, alerted, last_alert_at)
 WHERE s.job_name = v.job_name
"""
DELETE_VERDICTS = "DELETE FROM notify_verdicts WHERE id = ANY ($1::bigint[])"

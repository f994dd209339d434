"""The worker's statements: start, heartbeat, complete, interrupt."""

# fmt: off
# SQL keeps its hand layout here: the formatter would split the spliced
# constants across lines and separate each noqa from the line it covers.

from actors.adapters.postgres.statements.reaper import SET_VERDICT
from actors.adapters.postgres.statements.row_rules import (
    COMPLETION_ACCEPTED,
    DUE_TO_START,
    HELD_RUNNING,
    MUST_NOT_RUN,
    STARTABLE,
)

# A run already running under this worker and epoch is taken up again only
# when the worker says so ($5, `retake`): the start committed but its reply
# never reached the worker (the connection dropped), so the worker knows it
# never began that execution, and the message came back. Without that word
# the row is left alone (the worker is told "owned"): the worker may have run
# the attempt already (its actor crashed mid-execution and the supervisor
# restarted it with the same id; its completion could not be recorded), and
# starting it again would be a second execution under the same fencing token.
# The lease recovers such a run, and the next claim hands it a new token.
#
# A claimed run is judged again here, on the row as locked: one that waited
# in the stream past its starting deadline, or that a newer instant
# superseded meanwhile, is recorded skipped instead of started (returned with
# `skipped` set; the worker acks its message as changing nothing). A run
# already running is not judged again: its start was decided.
#
# A claimed run of a paused job is not started: it goes back to pending under
# the same epoch (its message is then stale; the worker is told so and acks),
# as SET_PAUSED hands back the claims it sees. This catches the claim that was
# not yet committed when the pause was: it read the job unpaused, and the
# pause, which locks only claimed rows, did not see its row. A start begins
# after the claim committed, so once the pause has committed no run starts.
#
# A claimed run is never started before it is due on the database's clock: a
# run claimed ahead (claim_ahead) whose worker's estimate of that clock ran a
# little fast is left claimed, and the worker is told "early" and holds it a
# little longer. So started_at >= due_at whatever the worker's clock says.
#
# The message's epoch and retake travel inside the lock CTE, and the updates
# join that CTE alone (by id, the primary key): joined to the unnest as well,
# the planner estimated the (id, epoch) match at one row once job_runs had
# statistics, and compared every row of the CTE with every other (a nested
# loop: 250 ms for a batch of 1,000, a second and a half for 2,500; a herd's
# starts took seconds from its second minute on).
#
# The guards are judged on the columns of the row as locked (`l.at_*`), not on
# `r` in the UPDATE: the row is locked by this statement, so they are the
# same values. A predicate on r.state in the UPDATE let the planner drive it
# from the partial index of claimed and running rows (job_runs_leased) when
# the statistics said that index was nearly empty (a backlog claimed since the
# last ANALYZE), comparing every claimed row with every row of the batch: a
# drain of 20,000 runs started 256 runs per 1.4 s. Joined by id alone, each
# update is one primary-key probe per run, whatever the statistics say.
START_RUNS = """
WITH m AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $5::boolean[])
                 AS m(id, epoch, retake)),
locked AS MATERIALIZED (
    SELECT r.id, m.epoch, m.retake,
           CASE WHEN r.state = 'claimed' THEN """ + MUST_NOT_RUN + """ END AS skip,
           (r.state = 'claimed' AND j.paused) AS paused,
           r.state AS at_state, r.claim_epoch AS at_epoch, r.lease_owner AS at_owner,
           r.due_at <= now() AS at_due
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
      JOIN m ON m.id = r.id
     WHERE r.id = ANY ($1::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
),
handed_back AS (
    UPDATE job_runs r
       SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
           updated_at = now()
      FROM locked l
     WHERE r.id = l.id AND l.paused AND l.at_epoch = l.epoch AND l.at_state = 'claimed'
    RETURNING r.id
),
moved AS (
    UPDATE job_runs r
       SET state = CASE WHEN l.skip IS NULL THEN 'running' ELSE 'skipped' END,
           lease_owner = CASE WHEN l.skip IS NULL THEN $3::text END,
           lease_expires_at = CASE WHEN l.skip IS NULL THEN now() + $4::interval END,
           started_at = CASE WHEN l.skip IS NULL AND r.state = 'claimed' THEN now()
                             ELSE r.started_at END,
           claimed_at = CASE WHEN l.skip IS NULL THEN r.claimed_at END,
           outcome = CASE WHEN l.skip IS NULL THEN r.outcome ELSE 'skipped' END,
           error = COALESCE(l.skip, r.error),
           finished_at = CASE WHEN l.skip IS NULL THEN r.finished_at ELSE now() END,
           updated_at = now()
      FROM locked l
     WHERE r.id = l.id AND """ + STARTABLE + """
       AND NOT l.paused AND """ + DUE_TO_START + """
    RETURNING r.id, r.claim_epoch, r.job_id, r.scheduled_at, r.attempt, l.skip, r.trigger,
              r.due_at
)
SELECT s.id::text AS id, s.claim_epoch, j.name, s.scheduled_at, s.attempt, j.max_attempts,
       j.definition, j.fingerprint, s.skip AS skipped, s.trigger, s.due_at
  FROM moved s JOIN jobs j ON j.id = s.job_id
"""  # noqa: S608 - spliced from a constant, never from input
# A clean shutdown whose grace ran out hands its unfinished runs back. Where
# each goes is actors.domain.decide_attempt's verdict (Outcome.INTERRUPTED:
# pending again at once, the attempt number not used up, so a deploy does not
# turn a max_attempts = 1 run into a failure), decided in Python between the
# two statements below, in one transaction, as the reaper's are. The
# interruption is kept in the history. The rows are locked in id order (see
# "row locks" above); the guards (this worker, this epoch, still running)
# are judged on the rows as locked, and again by the update.
LOCK_INTERRUPTED = """
SELECT r.id::text AS id, r.state, r.attempt, r.claim_epoch, r.lease_owner, r.started_at,
       j.max_attempts
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE r.id = ANY ($1::uuid[])
 ORDER BY r.id
   FOR NO KEY UPDATE OF r
"""
# The verdicts, one row each: next state, attempt and due delay; the attempt
# row keeps the attempt number and start time as they were.
APPLY_INTERRUPTED = """
WITH v AS (
    SELECT * FROM unnest($2::uuid[], $3::bigint[], $4::text[], $5::int[], $6::float8[],
                         $7::int[], $8::timestamptz[])
        AS v(id, epoch, state, next_attempt, due_s, attempt, started_at)
),
back AS (
    UPDATE job_runs r
       """ + SET_VERDICT + """,
           started_at = CASE WHEN v.state = 'pending' THEN NULL ELSE r.started_at END,
           lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
      FROM v
     WHERE r.id = v.id AND r.claim_epoch = v.epoch AND r.state = 'running'
       AND r.lease_owner = $1
    RETURNING r.id, r.claim_epoch
)
INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome, error)
SELECT back.id, v.attempt, back.claim_epoch, $1, v.started_at, 'interrupted',
       'the worker stopped before the run finished'
  FROM back JOIN v ON v.id = back.id
RETURNING run_id::text
"""  # noqa: S608 - spliced from a constant, never from input
RUN_STATES = """
SELECT id::text AS id, state, claim_epoch FROM job_runs WHERE id = ANY($1::uuid[])
"""
# The runs named by ($2 ids, $3 epochs) locked in id order, each with what it was as
# locked (at_epoch, at_state, at_owner) for HELD_CLAIMED or HELD_RUNNING to judge:
# the head of RELEASE_UNPUBLISHED and EXTEND_LEASES.
LOCK_HELD = """
WITH u AS (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS u(id, epoch)),
locked AS MATERIALIZED (
    SELECT r.id, u.epoch, r.claim_epoch AS at_epoch, r.state AS at_state,
           r.lease_owner AS at_owner
      FROM job_runs r JOIN u ON u.id = r.id
     WHERE r.id = ANY ($2::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
)"""

# The heartbeat: the same worker's running rows as its completions, so the
# same lock order (see "row locks" above). Guards on the row as locked, as
# START_RUNS says why.
EXTEND_LEASES = LOCK_HELD + """
UPDATE job_runs r SET lease_expires_at = now() + $4::interval, updated_at = now()
  FROM locked l
 WHERE r.id = l.id AND """ + HELD_RUNNING + """
RETURNING r.id::text, r.claim_epoch
"""

# Completions of many concurrent runs in one statement. Guarded by epoch and
# state: a zombie whose lease was reaped (epoch moved on) records nothing.
# The statement applies each run's verdict (actors.domain.decide_attempt:
# next state, attempt, due delay); it decides nothing itself.
# `prior` locks the rows (in id order, see "row locks" above) and keeps the
# attempt number and start time as they were, for the attempt row; the guards
# are judged on the row as locked, as START_RUNS says why.
COMPLETE_RUNS = """
WITH c AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::int[], $5::text[],
                         $6::text[], $7::text[], $8::int[], $9::float8[], $10::text[])
        AS c(id, epoch, outcome, exit_code, error, tail, state, attempt, due_s, worker)
),
prior AS MATERIALIZED (
    SELECT r.id, r.attempt AS prior_attempt, r.started_at AS prior_started_at, c.epoch,
           c.outcome, c.exit_code, c.error, c.tail, c.state, c.attempt, c.due_s, c.worker,
           r.claim_epoch AS at_epoch, r.state AS at_state
      FROM job_runs r JOIN c ON c.id = r.id
     WHERE r.id = ANY ($1::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
),
done AS (
    UPDATE job_runs r
       SET state = p.state,
           attempt = COALESCE(p.attempt, r.attempt),
           due_at = COALESCE(now() + make_interval(secs => p.due_s), r.due_at),
           finished_at = CASE WHEN p.state = 'pending' THEN NULL ELSE now() END,
           started_at = CASE WHEN p.state = 'pending' THEN NULL ELSE r.started_at END,
           lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
           outcome = p.outcome, exit_code = p.exit_code, error = p.error,
           output_tail = p.tail, updated_at = now()
      FROM prior p
     WHERE r.id = p.id AND """ + COMPLETION_ACCEPTED + """
    RETURNING r.id, r.claim_epoch, p.prior_attempt, p.prior_started_at, p.worker, p.outcome,
              p.exit_code, p.error, p.tail
)
INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome,
                              exit_code, error, output_tail)
SELECT id, prior_attempt, claim_epoch, worker, prior_started_at, outcome, exit_code, error, tail
  FROM done
RETURNING run_id::text, claim_epoch
"""  # noqa: S608 - spliced from a constant, never from input

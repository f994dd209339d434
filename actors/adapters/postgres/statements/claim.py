"""Claiming due runs, skipping those that must not run, releasing unpublished claims."""

# fmt: off
# SQL keeps its hand layout here: the formatter would split the spliced
# constants across lines and separate each noqa from the line it covers.

from actors.adapters.postgres.statements.row_rules import (
    CLAIMABLE,
    HELD_CLAIMED,
    JOB_BUSY,
    JOB_OPEN,
    MOVED_ON,
    MUST_NOT_RUN,
    OVERLAP_FORBIDDEN,
    OVERLAP_FORBIDDEN_JOB,
    RUNS_BESIDE_OTHERS,
    aliased,
)
from actors.adapters.postgres.statements.worker import LOCK_HELD

# Claimed but not yet started, all replicas together: the in-flight bound.
# Counted in its own statement so that the claim's LIMIT is a plain number the
# planner can see (a computed LIMIT made it plan for the whole table).
COUNT_CLAIMED = "SELECT count(*) FROM job_runs WHERE state = 'claimed'"

# Why a due run `r` of job `j` must not run, or NULL when it may (MUST_NOT_RUN,
# actors/domain/row_rules.py: the start deadline and the `latest` supersede rule),
# judged in the claim, at the start and in the skip pass, always on the row as
# locked. Counting the newer runs that have moved on, not only the pending ones, is
# what makes `latest` hold when a replica claimed the newer one a moment before this
# judgement.

# What kind of work the run is, as the claim saw its job: "python:<target>",
# "shell" or "http". It travels in the dispatch message so that a worker knows,
# before the start, whether the run takes a process slot or runs on its event
# loop (an async python callable does not wait behind shell jobs' slots).
EXECUTOR_HINT = """(CASE WHEN j.definition -> 'executor' ->> 'kind' = 'python'
             THEN 'python:' || (j.definition -> 'executor' ->> 'target')
             ELSE j.definition -> 'executor' ->> 'kind' END)"""

# What both claims do with the batch they locked: claim the runs that may
# run; record the others skipped, with the reason, in the same statement (so
# a run whose deadline passed after the skip pass is never claimed, and is
# not left to be judged again by every claim). A skipped run keeps its epoch:
# it was never claimed. One UPDATE with CASEs rather than one per outcome:
# the planner cannot estimate a filter on the verdict, and guessed one row.
_CLAIM_OR_SKIP = """
UPDATE job_runs r
   SET state = CASE WHEN due.skip IS NULL THEN 'claimed' ELSE 'skipped' END,
       exclusive = CASE WHEN due.skip IS NULL THEN %(exclusive)s ELSE r.exclusive END,
       lease_owner = CASE WHEN due.skip IS NULL THEN $1::text END,
       lease_expires_at = CASE WHEN due.skip IS NULL THEN now() + $3::interval END,
       claim_epoch = r.claim_epoch + CASE WHEN due.skip IS NULL THEN 1 ELSE 0 END,
       claimed_at = CASE WHEN due.skip IS NULL THEN now() END,
       outcome = CASE WHEN due.skip IS NULL THEN r.outcome ELSE 'skipped' END,
       error = COALESCE(due.skip, r.error),
       finished_at = CASE WHEN due.skip IS NULL THEN r.finished_at ELSE now() END,
       updated_at = now()
  FROM due, jobs j
 WHERE r.id = due.id AND j.id = r.job_id AND r.state = 'pending'
RETURNING r.id::text, j.name, r.scheduled_at, r.attempt, r.claim_epoch, due.skip, r.due_at,
          """ + EXECUTOR_HINT + """ AS executor
"""

# One statement claims a disjoint batch. ORDER BY sits inside the locking
# select: SKIP LOCKED applies to the rows in due order, so the oldest due runs
# go first; nothing downstream relies on the order of RETURNING. The LIMIT
# keeps claimed-but-not-started runs under a bound, so no lease can expire
# while its run waits in the stream. `exclusive` is cleared: a run left over
# from when its job was forbid/queue must not count against the overlap index.
# The scan stays on the pending index in due order; the policy verdict is
# computed on each locked row (re-evaluated on its latest version when it
# changed since the statement's snapshot). The job is looked up per due row
# (OFFSET 0 keeps the planner from turning the join around): driven from the
# jobs, the planner read each job's whole pending range, the horizon, to find
# the few due rows, and with a due backlog it read all of it and sorted.
# A run an operator added with its own overlap = allow (sql/0015) is claimed
# here too, whatever its job's overlap: it runs beside the job's other runs.
# SKIP LOCKED: the claim never waits for a row lock, so it cannot deadlock
# with the statements that lock rows in id order.
# $4 (claim_ahead): runs due within it are claimed too, and held by their
# worker until their instant (START_RUNS starts none before it is due). The
# verdict is still right for them: a run not yet due has not missed its
# deadline, and only instants already due supersede it; START_RUNS judges
# again at the start.
CLAIM_DUE_RUNS = """
WITH due AS (
    SELECT r.id, """ + MUST_NOT_RUN + """ AS skip
      FROM job_runs r
     CROSS JOIN LATERAL (
           SELECT j.start_deadline, j.catchup FROM jobs j
            WHERE j.id = r.job_id AND """ + JOB_OPEN + """
              AND """ + RUNS_BESIDE_OTHERS + """
           OFFSET 0) j
     WHERE """ + CLAIMABLE + """
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
     LIMIT $2
)""" + _CLAIM_OR_SKIP % {"exclusive": "false"}

# Runs of forbid/queue jobs: at most one per job, and only when none of the
# job's runs is claimed or running (NOT RUNS_BESIDE_OTHERS, its job's half outside
# the lateral and its run's inside; NOT JOB_BUSY). The partial unique index
# job_runs_one_active_exclusive is what makes this hold across replicas: a
# racing replica's statement fails on it (and claims nothing) instead of
# claiming a second run. A job's next run that must not run is recorded
# skipped instead; the next one is claimed on the next pass. A run with its
# own overlap = allow is the other claim's; one with queue or forbid (sql/0015)
# is taken here in instant order with the job's own, so a backfill of a forbid
# job runs one instant after another, and waits while any run is active.
# SKIP LOCKED as above: the only wait this statement can have is on that
# unique index, for another claim of a run of the same job, which then fails.
CLAIM_EXCLUSIVE_RUNS = """
WITH next_per_job AS (
    SELECT n.id
      FROM jobs j
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = j.id AND """ + CLAIMABLE + """
              AND r.overlap IS DISTINCT FROM 'allow'
            ORDER BY r.scheduled_at
            LIMIT 1) n
     WHERE """ + JOB_OPEN + """ AND j.overlap <> 'allow'
       AND NOT """ + JOB_BUSY + """
),
due AS (
    -- Driven from the (few) candidates, not from the due backlog.
    SELECT r.id, """ + MUST_NOT_RUN + """ AS skip
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE r.id = ANY (ARRAY(SELECT id FROM next_per_job)) AND r.state = 'pending'
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
     LIMIT $2
)""" + _CLAIM_OR_SKIP % {"exclusive": "true"}

# How long until the soonest pending run the claim could not take now is due
# (seconds on the database's clock), for the claimer to wake then rather than
# at its next poll. Only runs beyond now() + $1 (claim_ahead): one due already
# and still pending (over the in-flight bound, an exclusive job's next, a
# claim racing this one) is the poll's to retry, and must not wake the
# claimer in a loop. The pending index in due order, first enabled match.
NEXT_DUE_IN = """
SELECT extract(epoch FROM r.due_at - now())::float8
  FROM job_runs r
  JOIN jobs j ON j.id = r.job_id
 WHERE r.state = 'pending' AND r.due_at > now() + $1::interval AND """ + JOB_OPEN + """
 ORDER BY r.due_at
 LIMIT 1
"""

# The channel a trigger (sql/0008_pending_notify.sql) notifies when runs
# become pending: the payload is the schema and the seconds until the soonest
# of them is due, so a claimer listening wakes for an earlier run (a trigger,
# a backfill, a retry, a reload's new job) without waiting for its poll.
PENDING_CHANNEL = "claimd_runs_pending"

# Due runs that must not run are recorded skipped, with the reason, before
# each claim: what MUST_NOT_RUN says (start deadline, catchup = latest), and,
# with overlap = forbid, a due run while another run of the job is active
# (unless the run carries its own overlap, queue or allow, sql/0015: an
# operator's backfill waits its turn instead).
# The claims and the start judge the first two again, on the row as they lock
# it; this pass records the bulk (a backlog after an outage) a bounded number
# at a time, so that the claims rarely meet such a run.
#
# Each branch nominates candidates from the rows that can be skipped now, so
# the pass costs what there is to skip, not the number of jobs nor the
# horizon of future runs (sql/0006_tick_cost_indexes.sql). It runs every
# claim_interval, mostly finding nothing:
# - overlap = forbid: the forbid jobs (a partial index of jobs; usually none)
#   that have a run active, one index range of due runs each;
# - the start deadline: first scheduled attempts in instant order, from the
#   oldest up to now() - the shortest deadline of any job
#   (job_runs_pending_first_scheduled), each judged against its own job's
#   deadline: never the future part of the horizon;
# - catchup = latest: the latest jobs (a partial index), one index range each.
SKIP_UNRUNNABLE = """
WITH nominated AS (
    SELECT x.id, 'overlap forbidden: an earlier run was still active' AS reason
      FROM jobs j
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = j.id AND """ + OVERLAP_FORBIDDEN + """
            ORDER BY r.scheduled_at LIMIT $1) x
     WHERE """ + JOB_OPEN + """ AND """ + OVERLAP_FORBIDDEN_JOB + """
    UNION ALL
    SELECT x.id, NULL
      FROM (SELECT r.id FROM job_runs r
              JOIN jobs p ON p.id = r.job_id
             WHERE r.state = 'pending' AND r.trigger = 'schedule' AND r.attempt = 1
               AND r.scheduled_at < now() - (SELECT min(d.start_deadline) FROM jobs d
                                              WHERE """ + aliased(JOB_OPEN, j="d") + """
                                                AND d.start_deadline IS NOT NULL)
               AND r.scheduled_at < now() - p.start_deadline
               AND """ + aliased(JOB_OPEN, j="p") + """
             ORDER BY r.scheduled_at LIMIT $1) x
    UNION ALL
    SELECT x.id, NULL
      FROM jobs p
     CROSS JOIN LATERAL (
           SELECT max(n.scheduled_at) AS newest FROM job_runs n
            WHERE n.job_id = p.id AND n.trigger = 'schedule' AND n.scheduled_at <= now()
              AND """ + MOVED_ON + """) m
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = p.id AND r.state = 'pending' AND r.scheduled_at < m.newest
              AND r.trigger = 'schedule' AND r.due_at <= now()
            ORDER BY r.scheduled_at LIMIT $1) x
     WHERE """ + aliased(JOB_OPEN, j="p") + """ AND p.catchup = 'latest'
),
-- The verdict is given on the row as locked (its current version), so a run
-- another replica claimed, or that came back as a retry, meanwhile is judged
-- as it is now. SKIP LOCKED: a run someone else is changing is left to the
-- next pass, and this statement never waits (nor deadlocks).
verdict AS MATERIALIZED (
    SELECT r.id, COALESCE(""" + MUST_NOT_RUN + """, c.reason) AS reason
      FROM (SELECT DISTINCT ON (id) id, reason FROM nominated
             ORDER BY id, reason NULLS LAST LIMIT $1) c
      JOIN job_runs r ON r.id = c.id
      JOIN jobs j ON j.id = r.job_id
     WHERE r.state = 'pending'
     ORDER BY r.id
       FOR NO KEY UPDATE OF r SKIP LOCKED
)
UPDATE job_runs r
   SET state = 'skipped', outcome = 'skipped', error = v.reason, finished_at = now(),
       updated_at = now()
  FROM verdict v
 WHERE r.id = v.id AND v.reason IS NOT NULL AND r.state = 'pending'
RETURNING r.id::text, v.reason
"""  # noqa: S608 - spliced from a constant, never from input

# Runs of a job removed from the config that came back to pending after the
# removal (a retry, a reaped lease, a released publish) would wait forever:
# nothing claims runs of a disabled job. They are cancelled like the others.
# Driven from the disabled jobs (jobs_disabled), one index range of pending
# runs each (job_runs_pending_by_job): the reaper runs it every second, and a
# join let the planner read every pending row of the horizon to find none.
# $1: REMOVED_FROM_CONFIG (a re-add of the job finds them by it).
CANCEL_ORPHANED_RUNS = """
WITH orphaned AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE r.job_id = ANY (ARRAY(SELECT j.id FROM jobs j WHERE NOT j.enabled))
       AND r.state = 'pending'
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
)
UPDATE job_runs r
   SET state = 'cancelled', outcome = 'cancelled', error = $1,
       finished_at = now(), updated_at = now()
  FROM orphaned o
 WHERE r.id = o.id AND r.state = 'pending'
RETURNING r.id::text
"""

# Guarded by owner and epoch: only the runs this replica claimed under that
# epoch, and still only claimed, go back to pending.
RELEASE_UNPUBLISHED = LOCK_HELD + """
UPDATE job_runs r
   SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
       updated_at = now()
  FROM locked l
 WHERE r.id = l.id AND """ + HELD_CLAIMED + """
RETURNING r.id
"""

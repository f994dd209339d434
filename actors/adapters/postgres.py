"""PostgreSQL: the store of truth (asyncpg).

Every statement claimd runs lives in this module as a named, parameterised
constant. Every state change is one guarded UPDATE whose returned rows say
whether it happened. Time comes from the database (``now()``), so replicas
with skewed clocks still agree on leases and due times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import re
import socket
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import asyncpg

from actors.adapters.history import record_gaps
from actors.adapters.resources import sql_dir
from actors.domain import (
    DEFAULT_TIMEOUTS,
    ClaimedRun,
    ExecutionResult,
    IntervalSchedule,
    Job,
    Outcome,
    Plan,
    RetryPolicy,
    RunState,
    Schedule,
    TimeoutBudget,
    executor_from_dict,
    schedule_from_definition,
    take,
)
from actors.observability import RUNS_SKIPPED, DependencyHealth, get_logger
from actors.ports import (
    ClusterReading,
    Completion,
    DispatchMessage,
    JobReading,
    JobState,
    NotStarted,
    RecordRejected,
    StartedRun,
    StoreUnavailable,
)

log = get_logger("postgres")
POSTGRES_HEALTH = DependencyHealth("postgres")

# --- migrations ---------------------------------------------------------------

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS claimd_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""
# Only migration takes the advisory lock: two replicas starting at once apply
# each migration once, and the lock is per schema.
LOCK_MIGRATIONS = "SELECT pg_advisory_lock(hashtext('claimd.migrate:' || current_schema()))"
UNLOCK_MIGRATIONS = "SELECT pg_advisory_unlock(hashtext('claimd.migrate:' || current_schema()))"
APPLIED_MIGRATIONS = "SELECT version FROM claimd_migrations"
RECORD_MIGRATION = "INSERT INTO claimd_migrations (version, name) VALUES ($1, $2)"

_MIGRATION_NAME = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def migration_files(directory: Path | None = None) -> list[tuple[int, Path]]:
    """The numbered migrations in order."""
    directory = directory or sql_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _MIGRATION_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    applied_now: list[str] = []
    await conn.execute(LOCK_MIGRATIONS)
    try:
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        applied = {r["version"] for r in await conn.fetch(APPLIED_MIGRATIONS)}
        for version, path in migration_files():
            if version in applied:
                continue
            async with conn.transaction():
                # A migration may rewrite a big table: no statement timeout here.
                await conn.execute(path.read_text(encoding="utf-8"), timeout=24 * 3600)
                await conn.execute(RECORD_MIGRATION, version, path.name)
            applied_now.append(path.name)
    finally:
        await conn.execute(UNLOCK_MIGRATIONS)
    return applied_now


# --- row locks: one order ------------------------------------------------------
#
# Every statement below that changes several job_runs rows either locks them
# with SKIP LOCKED (the claims, the skip pass, the reaper, pruning) or locks
# them first in one order, by id, in a MATERIALIZED CTE
# (`SELECT ... ORDER BY id FOR NO KEY UPDATE`) that the UPDATE then joins.
# Without that, each UPDATE locks rows in whatever order its plan visits them
# (the order of the id array, or of the table): the heartbeat (in-flight
# order) and the completion batch (finish order) of one worker then lock the
# same rows in opposite orders, PostgreSQL finds the cycle after
# deadlock_timeout and aborts one of them, and the completion pipeline stalls.
# With one order, two statements that share rows can only wait, never cycle.
# SKIP LOCKED never waits for a row lock, so a statement using it cannot be
# part of a cycle whatever its order (the claims keep ORDER BY due_at, the
# reaper ORDER BY lease_expires_at: oldest first).
#
# The lock CTE names the rows by id only; the guards (state, epoch, owner)
# stay in the UPDATE's WHERE, which READ COMMITTED re-evaluates on the latest
# row version, the one the CTE locked. (A guard in the CTE too would make the
# planner estimate its size from stale state statistics, often one row, and
# then pick a nested loop over the whole leased set for the UPDATE.) The
# UPDATE must join the CTE: a row it changes is then always one the CTE
# locked first, in order.

# --- jobs ---------------------------------------------------------------------

UPSERT_JOB = """
INSERT INTO jobs (name, definition, fingerprint, enabled, max_attempts, overlap, catchup,
                  start_deadline)
VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7, $8)
ON CONFLICT (name) DO UPDATE
   SET definition = EXCLUDED.definition,
       fingerprint = EXCLUDED.fingerprint,
       enabled = EXCLUDED.enabled,
       max_attempts = EXCLUDED.max_attempts,
       overlap = EXCLUDED.overlap,
       catchup = EXCLUDED.catchup,
       start_deadline = EXCLUDED.start_deadline,
       updated_at = now()
 WHERE jobs.fingerprint IS DISTINCT FROM EXCLUDED.fingerprint
    OR jobs.enabled IS DISTINCT FROM EXCLUDED.enabled
RETURNING id, (xmax = 0) AS inserted,
          (SELECT j.definition -> 'schedule' FROM jobs j WHERE j.name = $1) AS old_schedule
"""
# A reload changes many job rows in one transaction (the upserts, the
# disabling of removed jobs): it locks every row it may change first, in id
# order, as the materializer's high-water update does. Upserting in the
# config's order instead locked them in that order: two replicas whose files
# list the jobs differently (a rolling deploy), or a reload beside a
# materializer, deadlocked. Jobs new to the table are then inserted in name
# order, so two reloads adding the same jobs wait on each other's inserts in
# one order too.
LOCK_JOBS_FOR_SYNC = """
SELECT id FROM jobs WHERE enabled OR name = ANY ($1::text[]) ORDER BY id FOR NO KEY UPDATE
"""
# A changed schedule: future pending runs of the old schedule are withdrawn and
# the materializer starts again from now (where the audit starts judging it).
WITHDRAW_FUTURE_RUNS = """
WITH doomed AS MATERIALIZED (
    SELECT id FROM job_runs
     WHERE job_id = $1 AND state = 'pending' AND trigger = 'schedule' AND scheduled_at > now()
     ORDER BY id
       FOR UPDATE
),
gone AS (
    DELETE FROM job_runs r USING doomed d
     WHERE r.id = d.id AND r.state = 'pending' AND r.trigger = 'schedule'
       AND r.scheduled_at > now()
    RETURNING 1
)
UPDATE jobs SET materialized_until = now(), planned_since = now() WHERE id = $1
RETURNING (SELECT count(*) FROM gone) AS withdrawn
"""
# A job removed from the config file is disabled, its history kept and its
# future pending runs cancelled.
DISABLE_REMOVED_JOBS = """
WITH off AS (
    UPDATE jobs SET enabled = false, updated_at = now()
     WHERE enabled AND NOT (name = ANY($1::text[]))
    RETURNING id
),
doomed AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE r.job_id IN (SELECT id FROM off) AND r.state = 'pending'
     ORDER BY r.id
       FOR NO KEY UPDATE
)
UPDATE job_runs r SET state = 'cancelled', outcome = 'cancelled', error = 'job removed from config',
       finished_at = now(), updated_at = now()
  FROM doomed d WHERE r.id = d.id AND r.state = 'pending'
RETURNING r.id
"""
ACTIVE_JOBS = """
SELECT id, name, materialized_until, paused, fingerprint, definition, created_at
  FROM jobs WHERE enabled
"""
# The one clock: every replica plans on the database's now(), never its own.
DATABASE_NOW = "SELECT now()"

# --- materialize --------------------------------------------------------------

# Idempotent by the unique constraint: any number of replicas may materialize
# the same instants; the second insert of (job, instant) changes nothing.
#
# A plan is written only while the job's definition is the one it was made
# from. The guarded UPDATE of the high-water mark runs first, in the same
# transaction, and row-locks each job whose fingerprint still matches; the
# insert then writes only for those jobs. A reload's UPSERT of the same job row
# waits for that lock, so its withdrawal of future runs sees (and deletes) the
# rows written here; a plan from a superseded definition writes nothing.
#
# A plan is also written only while it is fresh on the database's clock ($4:
# the now() it was planned at plus its on-time tolerance). A plan that waited
# longer (a stalled replica) would keep as "late" instants that every fresh
# plan counts as missed; it writes nothing, and the next tick plans again.
#
# The job rows are locked in id order first, as every statement that changes
# several job rows does (see "row locks" above, and LOCK_JOBS_FOR_SYNC): the
# UPDATE alone locks them in whatever order its plan visits them, so two
# replicas (or a reload) listing the jobs in different orders could deadlock.
ADVANCE_HIGH_WATER = """
WITH locked AS MATERIALIZED (
    SELECT id FROM jobs WHERE id = ANY ($1::bigint[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE jobs j SET materialized_until = GREATEST(COALESCE(j.materialized_until, u.until), u.until)
  FROM unnest($1::bigint[], $2::timestamptz[], $3::text[]) AS u(id, until, fingerprint)
  JOIN locked l ON l.id = u.id
 WHERE j.id = u.id AND j.fingerprint = u.fingerprint AND j.enabled
   AND ($4::timestamptz IS NULL OR now() <= $4::timestamptz)
RETURNING j.id
"""
INSERT_PLANNED_RUNS = """
INSERT INTO job_runs (job_id, scheduled_at, due_at)
SELECT u.job_id, u.scheduled_at, u.due_at
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[])
       AS u(job_id, scheduled_at, due_at)
 WHERE u.job_id = ANY ($4::bigint[])
ON CONFLICT ON CONSTRAINT job_runs_one_row_per_instant DO NOTHING
"""

# --- claim --------------------------------------------------------------------

# Claimed but not yet started, all replicas together: the in-flight bound.
# Counted in its own statement so that the claim's LIMIT is a plain number the
# planner can see (a computed LIMIT made it plan for the whole table).
COUNT_CLAIMED = "SELECT count(*) FROM job_runs WHERE state = 'claimed'"

# Why a due run `r` of job `j` must not run, or NULL when it may: the one
# definition of the start deadline and the `latest` supersede rule, judged in
# the claim, at the start and in the skip pass, always on the row as locked.
#
# - A first attempt of a scheduled run not started by scheduled_at +
#   start_deadline. A retry is the same instant trying again; a trigger or a
#   backfill is an operator asking for a (past) instant to run now.
# - With catchup = latest, a scheduled run once a newer scheduled instant of
#   the job is due (pending and due, or already claimed, running or
#   finished): only the newest instant matters. Counting the newer runs that
#   have moved on, not only the pending ones, is what makes it hold when a
#   replica claimed the newer one a moment before this judgement.
#
# Both read only the row, its job and (for `latest`) one index range of the
# job's instants between this one and now: the cost follows the candidates
# judged, not the backlog. A constant spliced into the statements below,
# never input.
_MUST_NOT_RUN = """CASE
    WHEN r.trigger = 'schedule' AND r.attempt = 1
         AND r.scheduled_at < now() - j.start_deadline
    THEN 'missed its starting deadline'
    WHEN j.catchup = 'latest' AND r.trigger = 'schedule' AND EXISTS (
         SELECT 1 FROM job_runs n
          WHERE n.job_id = r.job_id AND n.trigger = 'schedule'
            AND n.scheduled_at > r.scheduled_at AND n.scheduled_at <= now()
            AND (n.state IN ('claimed', 'running', 'succeeded', 'failed')
                 OR (n.state = 'pending' AND n.due_at <= now())))
    THEN 'superseded by a later instant (catchup = latest)'
END"""

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
RETURNING r.id::text, j.name, r.scheduled_at, r.attempt, r.claim_epoch, due.skip
"""

# One statement claims a disjoint batch. ORDER BY sits inside the locking
# select: SKIP LOCKED applies to the rows in due order, so the oldest due runs
# go first; nothing downstream relies on the order of RETURNING. The LIMIT
# keeps claimed-but-not-started runs under a bound, so no lease can expire
# while its run waits in the stream. `exclusive` is cleared: a run left over
# from when its job was forbid/queue must not count against the overlap index.
# The scan stays on the pending index in due order; the policy verdict is
# computed on each locked row (re-evaluated on its latest version when it
# changed since the statement's snapshot).
# SKIP LOCKED: the claim never waits for a row lock, so it cannot deadlock
# with the statements that lock rows in id order.
CLAIM_DUE_RUNS = """
WITH due AS (
    SELECT r.id, """ + _MUST_NOT_RUN + """ AS skip
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE r.state = 'pending' AND r.due_at <= now() AND j.enabled AND NOT j.paused
       AND j.overlap = 'allow'
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
     LIMIT $2
)""" + _CLAIM_OR_SKIP % {"exclusive": "false"}

# Runs of forbid/queue jobs: at most one per job, and only when none of the
# job's runs is claimed or running. The partial unique index
# job_runs_one_active_exclusive is what makes this hold across replicas: a
# racing replica's statement fails on it (and claims nothing) instead of
# claiming a second run. A job's next run that must not run is recorded
# skipped instead; the next one is claimed on the next pass.
# SKIP LOCKED as above: the only wait this statement can have is on that
# unique index, for another claim of a run of the same job, which then fails.
CLAIM_EXCLUSIVE_RUNS = """
WITH next_per_job AS (
    SELECT n.id
      FROM jobs j
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = j.id AND r.state = 'pending' AND r.due_at <= now()
            ORDER BY r.scheduled_at
            LIMIT 1) n
     WHERE j.enabled AND NOT j.paused AND j.overlap <> 'allow'
       AND NOT EXISTS (SELECT 1 FROM job_runs a
                        WHERE a.job_id = j.id AND a.state IN ('claimed', 'running'))
),
due AS (
    -- Driven from the (few) candidates, not from the due backlog.
    SELECT r.id, """ + _MUST_NOT_RUN + """ AS skip
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE r.id = ANY (ARRAY(SELECT id FROM next_per_job)) AND r.state = 'pending'
     ORDER BY r.due_at
       FOR UPDATE OF r SKIP LOCKED
     LIMIT $2
)""" + _CLAIM_OR_SKIP % {"exclusive": "true"}

# Due runs that must not run are recorded skipped, with the reason, before
# each claim: what _MUST_NOT_RUN says (start deadline, catchup = latest), and,
# with overlap = forbid, a due run while another run of the job is active.
# The claims and the start judge the first two again, on the row as they lock
# it; this pass records the bulk (a backlog after an outage) a bounded number
# per job at a time, so that the claims rarely meet such a run.
SKIP_UNRUNNABLE = """
WITH policy AS (
    SELECT j.id, j.overlap, j.catchup, j.start_deadline,
           EXISTS (SELECT 1 FROM job_runs a
                    WHERE a.job_id = j.id AND a.state IN ('claimed', 'running')) AS active
      FROM jobs j
     WHERE j.enabled AND NOT j.paused
),
-- Each branch nominates candidates from one index range per job
-- (job_runs_pending_by_job, job_runs_job_scheduled), so the cost follows the
-- number of jobs, not the backlog or the horizon.
nominated AS (
    SELECT x.id, 'overlap forbidden: an earlier run was still active' AS reason
      FROM policy p
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = p.id AND r.state = 'pending' AND r.scheduled_at <= now()
              AND r.due_at <= now()
            ORDER BY r.scheduled_at LIMIT $1) x
     WHERE p.overlap = 'forbid' AND p.active
    UNION ALL
    SELECT x.id, NULL
      FROM policy p
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = p.id AND r.state = 'pending'
              AND r.scheduled_at < now() - p.start_deadline
              AND r.trigger = 'schedule' AND r.attempt = 1
            ORDER BY r.scheduled_at LIMIT $1) x
     WHERE p.start_deadline IS NOT NULL
    UNION ALL
    SELECT x.id, NULL
      FROM policy p
     CROSS JOIN LATERAL (
           SELECT max(n.scheduled_at) AS newest FROM job_runs n
            WHERE n.job_id = p.id AND n.trigger = 'schedule' AND n.scheduled_at <= now()
              AND (n.state IN ('claimed', 'running', 'succeeded', 'failed')
                   OR (n.state = 'pending' AND n.due_at <= now()))) m
     CROSS JOIN LATERAL (
           SELECT r.id FROM job_runs r
            WHERE r.job_id = p.id AND r.state = 'pending' AND r.scheduled_at < m.newest
              AND r.trigger = 'schedule' AND r.due_at <= now()
            ORDER BY r.scheduled_at LIMIT $1) x
     WHERE p.catchup = 'latest'
),
-- The verdict is given on the row as locked (its current version), so a run
-- another replica claimed, or that came back as a retry, meanwhile is judged
-- as it is now. SKIP LOCKED: a run someone else is changing is left to the
-- next pass, and this statement never waits (nor deadlocks).
verdict AS MATERIALIZED (
    SELECT r.id, COALESCE(""" + _MUST_NOT_RUN + """, c.reason) AS reason
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
CANCEL_ORPHANED_RUNS = """
WITH orphaned AS MATERIALIZED (
    SELECT r.id FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE NOT j.enabled AND r.state = 'pending'
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
)
UPDATE job_runs r
   SET state = 'cancelled', outcome = 'cancelled', error = 'job removed from config',
       finished_at = now(), updated_at = now()
  FROM orphaned o
 WHERE r.id = o.id AND r.state = 'pending'
RETURNING r.id::text
"""

# Guarded by owner and epoch: only the runs this replica claimed under that
# epoch, and still only claimed, go back to pending.
RELEASE_UNPUBLISHED = """
WITH u AS (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS u(id, epoch)),
locked AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE r.id = ANY ($2::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE
)
UPDATE job_runs r
   SET state = 'pending', lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
       updated_at = now()
  FROM u JOIN locked l ON l.id = u.id
 WHERE r.id = u.id AND r.claim_epoch = u.epoch AND r.lease_owner = $1 AND r.state = 'claimed'
RETURNING r.id
"""

# --- worker -------------------------------------------------------------------

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
START_RUNS = """
WITH m AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $5::boolean[])
                 AS m(id, epoch, retake)),
locked AS MATERIALIZED (
    SELECT r.id, CASE WHEN r.state = 'claimed' THEN """ + _MUST_NOT_RUN + """ END AS skip
      FROM job_runs r
      JOIN jobs j ON j.id = r.job_id
     WHERE r.id = ANY ($1::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
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
      FROM m JOIN locked l ON l.id = m.id
     WHERE r.id = m.id AND r.claim_epoch = m.epoch
       AND (r.state = 'claimed' OR (r.state = 'running' AND r.lease_owner = $3 AND m.retake))
    RETURNING r.id, r.claim_epoch, r.job_id, r.scheduled_at, r.attempt, l.skip, r.trigger,
              r.due_at
)
SELECT s.id::text AS id, s.claim_epoch, j.name, s.scheduled_at, s.attempt, j.max_attempts,
       j.definition, s.skip AS skipped, s.trigger, s.due_at
  FROM moved s JOIN jobs j ON j.id = s.job_id
"""  # noqa: S608 - spliced from a constant, never from input
# A clean shutdown whose grace ran out hands its unfinished runs back: pending
# again at once, the attempt number not used up (a deploy must not turn a
# max_attempts = 1 run into a failure), the interruption kept in the history.
# `prior` locks the rows (in id order) and keeps the attempt and start time
# as they were before the update.
INTERRUPT_RUNS = """
WITH u AS (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS u(id, epoch)),
prior AS MATERIALIZED (
    SELECT r.id, r.attempt, r.started_at FROM job_runs r
     WHERE r.id = ANY ($2::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE
),
back AS (
    UPDATE job_runs r
       SET state = 'pending', due_at = now(), lease_owner = NULL, lease_expires_at = NULL,
           claimed_at = NULL, started_at = NULL, updated_at = now()
      FROM u JOIN prior ON prior.id = u.id
     WHERE r.id = u.id AND r.claim_epoch = u.epoch AND r.state = 'running'
       AND r.lease_owner = $1
    RETURNING r.id, r.claim_epoch
)
INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome, error)
SELECT back.id, prior.attempt, back.claim_epoch, $1, prior.started_at, 'interrupted',
       'the worker stopped before the run finished'
  FROM back JOIN prior ON prior.id = back.id
RETURNING run_id::text
"""
RUN_STATES = """
SELECT id::text AS id, state, claim_epoch FROM job_runs WHERE id = ANY($1::uuid[])
"""
# The heartbeat: the same worker's running rows as its completions, so the
# same lock order (see "row locks" above).
EXTEND_LEASES = """
WITH u AS (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS u(id, epoch)),
locked AS MATERIALIZED (
    SELECT r.id FROM job_runs r
     WHERE r.id = ANY ($2::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE
)
UPDATE job_runs r SET lease_expires_at = now() + $4::interval, updated_at = now()
  FROM u JOIN locked l ON l.id = u.id
 WHERE r.id = u.id AND r.claim_epoch = u.epoch AND r.state = 'running' AND r.lease_owner = $1
RETURNING r.id::text, r.claim_epoch
"""

# Completions of many concurrent runs in one statement. Guarded by epoch and
# state: a zombie whose lease was reaped (epoch moved on) records nothing.
# `prior` locks the rows (in id order, see "row locks" above) and keeps the
# attempt number and start time as they were, for the attempt row.
COMPLETE_RUNS = """
WITH c AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::int[], $5::text[],
                         $6::text[], $7::float8[], $8::text[])
        AS c(id, epoch, outcome, exit_code, error, tail, retry_s, worker)
),
prior AS MATERIALIZED (
    SELECT r.id, r.attempt, r.started_at FROM job_runs r
     WHERE r.id = ANY ($1::uuid[])
     ORDER BY r.id
       FOR NO KEY UPDATE
),
done AS (
    UPDATE job_runs r
       SET state = CASE WHEN c.outcome = 'succeeded' THEN 'succeeded'
                        WHEN c.retry_s IS NOT NULL THEN 'pending'
                        ELSE 'failed' END,
           attempt = r.attempt + CASE WHEN c.outcome <> 'succeeded' AND c.retry_s IS NOT NULL
                                      THEN 1 ELSE 0 END,
           due_at = CASE WHEN c.outcome <> 'succeeded' AND c.retry_s IS NOT NULL
                         THEN now() + make_interval(secs => c.retry_s) ELSE r.due_at END,
           finished_at = CASE WHEN c.outcome <> 'succeeded' AND c.retry_s IS NOT NULL
                              THEN NULL ELSE now() END,
           started_at = CASE WHEN c.outcome <> 'succeeded' AND c.retry_s IS NOT NULL
                             THEN NULL ELSE r.started_at END,
           lease_owner = NULL, lease_expires_at = NULL, claimed_at = NULL,
           outcome = c.outcome, exit_code = c.exit_code, error = c.error,
           output_tail = c.tail, updated_at = now()
      FROM c JOIN prior ON prior.id = c.id
     WHERE r.id = c.id AND r.claim_epoch = c.epoch AND r.state = 'running'
    RETURNING r.id, r.claim_epoch
)
INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome,
                              exit_code, error)
SELECT done.id, prior.attempt, done.claim_epoch, c.worker, prior.started_at, c.outcome,
       c.exit_code, c.error
  FROM done JOIN c ON c.id = done.id JOIN prior ON prior.id = done.id
RETURNING run_id::text, claim_epoch
"""
# Test-only "broken build" for the chaos harness (CLAIMD_FAULT_SKIP_EPOCH_GUARD=1):
# the same statement without its epoch guard, so the harness can show that it
# catches a zombie's late completion overwriting a newer attempt. Never set it.
COMPLETE_RUNS_UNFENCED = COMPLETE_RUNS.replace(
    "r.claim_epoch = c.epoch AND r.state = 'running'", "r.state = 'running'")

# --- reaper -------------------------------------------------------------------

# A lease that expired while claimed means the run never started: back to
# pending, same attempt. One that expired while running lost its worker: the
# attempt is over (recorded as lease_expired), and the run is retried or, at
# the job's attempt limit, failed. SKIP LOCKED: the reaper never waits for a
# row lock (see "row locks" above); what it judges is the row as it locked it.
REAP_EXPIRED_LEASES = """
WITH expired AS (
    SELECT id, job_id, state, attempt, claim_epoch, lease_owner, started_at FROM job_runs
     WHERE state IN ('claimed', 'running') AND lease_expires_at < now()
     ORDER BY lease_expires_at
       FOR UPDATE SKIP LOCKED
     LIMIT $1
),
prior AS (
    SELECT e.id, e.state, e.attempt, e.claim_epoch, e.lease_owner, e.started_at,
           j.max_attempts, j.name
      FROM expired e JOIN jobs j ON j.id = e.job_id
),
reaped AS (
    UPDATE job_runs r
       SET state = CASE WHEN p.state = 'running' AND p.attempt >= p.max_attempts
                        THEN 'failed' ELSE 'pending' END,
           attempt = CASE WHEN p.state = 'running' AND p.attempt < p.max_attempts
                          THEN r.attempt + 1 ELSE r.attempt END,
           finished_at = CASE WHEN p.state = 'running' AND p.attempt >= p.max_attempts
                              THEN now() END,
           outcome = CASE WHEN p.state = 'running' THEN 'lease_expired' ELSE r.outcome END,
           error = CASE WHEN p.state = 'running'
                        THEN 'lease expired on ' || p.lease_owner ELSE r.error END,
           started_at = NULL, claimed_at = NULL, lease_owner = NULL, lease_expires_at = NULL,
           updated_at = now()
      FROM prior p
     WHERE r.id = p.id
    RETURNING r.id, r.state
),
lost AS (
    INSERT INTO job_run_attempts (run_id, attempt, claim_epoch, worker, started_at, outcome,
                                  error)
    SELECT p.id, p.attempt, p.claim_epoch, p.lease_owner, p.started_at, 'lease_expired',
           'lease expired on ' || p.lease_owner
      FROM prior p WHERE p.state = 'running'
    ON CONFLICT DO NOTHING
)
SELECT reaped.id::text AS id, p.name, p.state AS from_state, reaped.state AS to_state
  FROM reaped JOIN prior p ON p.id = reaped.id
"""


# --- connections with deadlines ----------------------------------------------------


def split_hosts(dsn: str) -> list[str]:
    """One single-host URL per host of a multi-host URL, in order.

    ``postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write`` ->
    ``postgresql://u@h1:5432/db?...`` and ``postgresql://u@h2:5433/db?...``.
    Anything else (one host, a key=value DSN, hosts in the query) is returned whole.
    """
    scheme, sep, rest = dsn.partition("://")
    if not sep or scheme not in ("postgres", "postgresql"):
        return [dsn]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:end].rpartition("@")
    if "," not in hosts:
        return [dsn]
    return [f"{scheme}://{userinfo}{at}{host}{rest[end:]}" for host in hosts.split(",")]


class _HostByHost:
    """The pool's connect: one host at a time, each attempt with its own deadline.

    asyncpg tries the hosts of a multi-host URL in order under one timeout, so a
    first host that drops packets (a dead machine, not a refused port) would use
    it all up and the next host would never be tried. Here each host gets the
    connect timeout, the host that answered last is tried first, and a host
    that fails (or whose attempt is cut short by the pool's acquire timeout)
    goes to the back for the next attempt. ``target_session_attrs`` in the URL
    still applies per host: a standby is passed over until it is promoted.
    """

    def __init__(self, dsn: str, timeout: timedelta) -> None:
        self.dsns = split_hosts(dsn)
        self.timeout = timeout.total_seconds()
        self._next = 0

    async def __call__(self, _dsn: str, **kwargs: Any) -> asyncpg.Connection:
        kwargs.pop("timeout", None)
        error: Exception | None = None
        for _ in self.dsns:
            index = self._next
            self._next = (index + 1) % len(self.dsns)
            try:
                conn = await asyncpg.connect(self.dsns[index], timeout=self.timeout, **kwargs)
            except Exception as exc:  # noqa: BLE001 - libpq too goes on to the next host
                error = exc
                continue
            self._next = index
            return conn
        assert error is not None
        raise error


def _keepalive_connection_class(timeouts: TimeoutBudget) -> type[asyncpg.Connection]:
    """Connections whose socket notices a silent peer (TCP keepalive, TCP_USER_TIMEOUT).

    asyncpg has no keepalive options (MagicStack/asyncpg#606), but every
    connection it makes is built from this class with its transport.
    """
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
            ("TCP_KEEPIDLE", int(timeouts.keepalive_idle.total_seconds())),
            ("TCP_KEEPINTVL", int(timeouts.keepalive_interval.total_seconds())),
            ("TCP_KEEPCNT", timeouts.keepalive_count),
            # Data sent but never acknowledged (a blackhole) fails the socket too.
            ("TCP_USER_TIMEOUT", int(timeouts.database_dead_after().total_seconds() * 1000))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))

    class KeepaliveConnection(asyncpg.Connection):
        def __init__(self, protocol: Any, transport: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(protocol, transport, *args, **kwargs)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                for level, option, value in options:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(level, option, value)

    return KeepaliveConnection


class _BoundedPool(asyncpg.Pool):
    """A pool whose acquire (and so the release after it) has a deadline by default.

    asyncpg's release waits for the cancel of a timed-out statement and for a
    reset; without a deadline that is another wait on a silent connection.
    """

    def __init__(self, *args: Any, acquire_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acquire_timeout = acquire_timeout

    def acquire(self, *, timeout: float | None = None) -> Any:
        return super().acquire(timeout=self._acquire_timeout if timeout is None else timeout)


async def connect_pool(dsn: str, timeouts: TimeoutBudget, *, min_size: int = 1,
                       max_size: int = 10,
                       init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
                       ) -> asyncpg.Pool:
    """An asyncpg pool whose every wait is bounded by the lease-derived ``timeouts``.

    A statement by ``statement_timeout`` (asyncpg's command timeout: the client
    stops waiting and cancels it), taking and returning a connection by
    ``acquire_timeout``, one connection attempt per host by ``connect_timeout``.
    TCP keepalive on both ends drops a connection whose peer went silent while
    idle: the client's socket options, and the server's ``tcp_keepalives_*``
    session settings (so the server frees the backend and its locks).
    """
    idle = int(timeouts.keepalive_idle.total_seconds())
    interval = int(timeouts.keepalive_interval.total_seconds())
    server_keepalive = {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(timeouts.keepalive_count),
        "tcp_user_timeout": str(int(timeouts.database_dead_after().total_seconds() * 1000)),
    }
    pool = _BoundedPool(
        dsn, min_size=min_size, max_size=max_size, max_queries=50_000,
        max_inactive_connection_lifetime=300.0, loop=None, init=init,
        connect=_HostByHost(dsn, timeouts.connect_timeout),
        connection_class=_keepalive_connection_class(timeouts), record_class=asyncpg.Record,
        acquire_timeout=timeouts.acquire_timeout.total_seconds(),
        command_timeout=timeouts.statement_timeout.total_seconds(),
        server_settings=server_keepalive)
    await pool
    return pool


# --- cluster-wide figures for /metrics ------------------------------------------

# Read on scrape (rate-limited by actors/cluster_metrics.py), so every replica
# reports the same figures straight from the truth. "Overdue": due and not yet
# started (pending, or claimed and still on its way to a worker), of enabled
# jobs that are not paused. Each part uses an index: the pending partial index,
# the leased one, and job_runs_job_last_finished (one probe per job).
CLUSTER_JOB_FIGURES = """
WITH due AS (
    SELECT job_id, due_at FROM job_runs WHERE state = 'pending' AND due_at <= now()
    UNION ALL
    SELECT job_id, due_at FROM job_runs WHERE state = 'claimed' AND due_at <= now()
),
overdue AS (SELECT job_id, count(*) AS n, min(due_at) AS oldest FROM due GROUP BY job_id)
SELECT j.name, j.paused, j.fingerprint, j.definition,
       s.finished_at AS last_success, f.finished_at AS last_failure,
       CASE WHEN j.paused THEN 0 ELSE coalesce(o.n, 0) END AS overdue,
       CASE WHEN j.paused OR o.oldest IS NULL THEN 0
            ELSE extract(epoch FROM now() - o.oldest) END::float8 AS overdue_oldest_age,
       CASE WHEN j.paused THEN 0
            ELSE greatest(0, extract(epoch FROM
                 now() - coalesce(j.materialized_until, j.created_at))) END::float8
           AS materialized_behind
  FROM jobs j
  LEFT JOIN overdue o ON o.job_id = j.id
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'succeeded'
                      ORDER BY r.finished_at DESC LIMIT 1) s ON true
  LEFT JOIN LATERAL (SELECT r.finished_at FROM job_runs r
                      WHERE r.job_id = j.id AND r.state = 'failed'
                      ORDER BY r.finished_at DESC LIMIT 1) f ON true
 WHERE j.enabled
 ORDER BY j.name
"""
CLUSTER_LEASE_FIGURES = """
SELECT count(*) FILTER (WHERE state = 'claimed') AS claimed,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE lease_expires_at < now()) AS past_lease
  FROM job_runs WHERE state IN ('claimed', 'running')
"""

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _is_outage(exc: BaseException) -> bool:
    # InternalClientError is what asyncpg raises when a pooled connection the
    # server closed (a restart, pg_terminate_backend) is used again.
    if isinstance(exc, OSError | TimeoutError | asyncpg.PostgresConnectionError
                  | asyncpg.exceptions.InternalClientError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", "") or ""
        return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES
    return False


def is_unreachable(exc: BaseException) -> bool:
    """Whether an error (from connecting, say) means the database is away, not refusing us."""
    return _is_outage(exc)


def _outage_as_store_unavailable(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            if _is_outage(exc):
                reason = f"{fn.__name__}: {type(exc).__name__}: {exc}"
                POSTGRES_HEALTH.lost(reason)
                raise StoreUnavailable(reason) from exc
            raise
        POSTGRES_HEALTH.reached()
        return result
    return wrapper


def _store_methods_report_outages(cls: type[T]) -> type[T]:
    """Every public coroutine method raises StoreUnavailable when the database is away."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _outage_as_store_unavailable(member))
    return cls


@_store_methods_report_outages
class PostgresRunStore:
    """RunStore on PostgreSQL through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool,
                 close_timeout: timedelta = DEFAULT_TIMEOUTS.close_timeout) -> None:
        self._pool = pool
        self._close_timeout = close_timeout

    @classmethod
    async def connect(cls, dsn: str, *, min_size: int = 1, max_size: int = 10,
                      timeouts: TimeoutBudget = DEFAULT_TIMEOUTS) -> PostgresRunStore:
        """A pool whose every call has a deadline from ``timeouts`` (see connect_pool)."""
        pool = await connect_pool(dsn, timeouts, min_size=min_size, max_size=max_size,
                                  init=_init_connection)
        POSTGRES_HEALTH.reached()
        return cls(pool, timeouts.close_timeout)

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    async def close(self) -> None:
        """Close the pool, waiting at most the close timeout; then terminate what is left.

        Pool.close() waits for every connection to be released and for the server
        to acknowledge each close: on a silent connection that is forever.
        """
        try:
            await asyncio.wait_for(self._pool.close(), self._close_timeout.total_seconds())
        except (TimeoutError, OSError, asyncpg.PostgresError,
                asyncpg.exceptions.InterfaceError) as exc:
            log.warning("database pool did not close in time; terminated",
                        waited_s=self._close_timeout.total_seconds(), error=repr(exc))
            self._pool.terminate()

    async def migrate(self) -> list[str]:
        async with self._pool.acquire() as conn:
            return await migrate(conn)

    async def ping(self) -> None:
        await self._pool.fetchval("SELECT 1")

    async def sync_jobs(self, jobs: Sequence[Job], keep: Sequence[str] = ()) -> dict[str, str]:
        """Upsert the config's jobs; disable those gone from it (but not ``keep``).

        Returns what happened to each job whose row changed: added, changed,
        removed.
        """
        changes: dict[str, str] = {}
        names = [job.name for job in jobs] + list(keep)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.fetch(LOCK_JOBS_FOR_SYNC, names)
            for job in sorted(jobs, key=lambda j: j.name):
                definition = job.definition()
                row = await conn.fetchrow(
                    UPSERT_JOB, job.name, json.dumps(definition), job.fingerprint(),
                    job.enabled, job.max_attempts, job.overlap.value, job.catchup.value,
                    job.start_deadline())
                if row is None:
                    continue
                if row["inserted"]:
                    changes[job.name] = "added"
                    continue
                changes[job.name] = "changed"
                old_schedule = row["old_schedule"]
                if old_schedule is not None and json.loads(old_schedule) != definition["schedule"]:
                    await conn.fetchval(WITHDRAW_FUTURE_RUNS, row["id"])
            removed = await conn.fetch(
                "SELECT name FROM jobs WHERE enabled AND NOT (name = ANY($1::text[]))", names)
            await conn.fetch(DISABLE_REMOVED_JOBS, names)
            for r in removed:
                changes[r["name"]] = "removed"
        return changes

    async def database_now(self) -> datetime:
        """The database's clock (``now()``): what every decision about time is made on."""
        value: datetime = await self._pool.fetchval(DATABASE_NOW)
        return value

    async def active_jobs(self) -> dict[str, JobState]:
        rows = await self._pool.fetch(ACTIVE_JOBS)
        return {r["name"]: JobState(id=r["id"], name=r["name"],
                                    materialized_until=r["materialized_until"],
                                    paused=r["paused"], fingerprint=r["fingerprint"],
                                    definition=r["definition"], created_at=r["created_at"])
                for r in rows}

    async def materialize_many(self, plans: Sequence[tuple[JobState, Plan]],
                               fresh_until: datetime | None = None) -> int:
        """Insert every planned run of several jobs and advance their marks, in one go.

        With ``fresh_until``, nothing is written once the database's now() is past it.
        """
        job_ids: list[int] = []
        scheduled: list[datetime] = []
        due: list[datetime] = []
        for job, plan in plans:
            for run in plan.runs:
                job_ids.append(job.id)
                scheduled.append(run.scheduled_at)
                due.append(run.due_at)
        async with self._pool.acquire() as conn, conn.transaction():
            current = await conn.fetch(ADVANCE_HIGH_WATER, [j.id for j, _ in plans],
                                       [p.materialized_until for _, p in plans],
                                       [j.fingerprint for j, _ in plans], fresh_until)
            if not current:
                return 0
            # What the plans dropped, recorded with them: no silent hole in history.
            await record_gaps(conn, [r["id"] for r in current],
                              [(job.id, gap) for job, plan in plans for gap in plan.dropped])
            if not job_ids:
                return 0
            status = await conn.execute(INSERT_PLANNED_RUNS, job_ids, scheduled, due,
                                        [r["id"] for r in current])
        return int(status.split()[-1])

    async def skip_unrunnable(self, limit: int) -> list[tuple[str, str]]:
        """Record as skipped the due runs that policies say must not run."""
        rows = await self._pool.fetch(SKIP_UNRUNNABLE, limit)
        return [(r["id"], r["reason"]) for r in rows]

    async def claim_due_runs(self, owner: str, limit: int, lease: timedelta,
                             max_claimed: int) -> list[ClaimedRun]:
        # No lock around the claim: replicas race, and SKIP LOCKED keeps their
        # batches disjoint. The in-flight bound is counted just before, so R
        # replicas claiming at the same instant can overshoot it by at most
        # (R - 1) x limit; it bounds queue wait, it is not a quota.
        # (A cluster-wide lock would make it exact, and would let one paused
        # replica holding it stop every claim.)
        room = min(limit, max(0, max_claimed - await self._pool.fetchval(COUNT_CLAIMED)))
        claimed = _claimed_or_skipped(
            await self._pool.fetch(CLAIM_DUE_RUNS, owner, room, lease) if room else [])
        try:
            claimed += _claimed_or_skipped(
                await self._pool.fetch(CLAIM_EXCLUSIVE_RUNS, owner, limit, lease))
        except asyncpg.UniqueViolationError:
            # Another replica claimed a run of the same exclusive job first; the
            # index refused ours and this statement claimed nothing this time.
            pass
        except Exception as exc:
            # Errors by kind: a bug in this statement reaches the supervisor
            # (passing it over with a warning would starve every forbid/queue
            # job for as long as other jobs have due runs); the first
            # statement's claims then wait out their lease, and the reaper
            # returns them. An outage is the one thing waited out here: the
            # first statement's claims are committed, so hand them on now.
            if not claimed or not _is_outage(exc):
                raise
            log.warning("exclusive claim failed (database unavailable); passing on the "
                        "other claims", error=repr(exc))
        return claimed

    async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int:
        rows = await self._pool.fetch(RELEASE_UNPUBLISHED, owner, [r.run_id for r in runs],
                                      [r.epoch for r in runs])
        return len(rows)

    async def start_runs(self, worker: str, messages: Sequence[DispatchMessage],
                         lease: timedelta, *, retake: Collection[tuple[str, int]] = (),
                         ) -> tuple[list[StartedRun], list[NotStarted]]:
        if not messages:
            return [], []
        ids = [m.run_id for m in messages]
        rows = await self._pool.fetch(START_RUNS, ids, [m.epoch for m in messages],
                                      worker, lease,
                                      [(m.run_id, m.epoch) in retake for m in messages])
        started: list[StartedRun] = []
        refused: list[NotStarted] = []
        for row in rows:
            if row["skipped"] is not None:
                # Judged again at the start and found unrunnable (it waited in
                # the stream past its deadline, or was superseded): recorded
                # skipped; the delivery changed nothing.
                _record_skip(row["id"], row["name"], row["skipped"], "start")
                refused.append(NotStarted(row["id"], row["claim_epoch"], "skipped",
                                          RunState.SKIPPED))
                continue
            try:
                started.append(_started_run(row))
            except (KeyError, ValueError, TypeError) as exc:
                # A definition this build cannot read (written by a newer one?):
                # fail this attempt on the record, retry it if attempts remain,
                # and let the rest of the batch run.
                await self._fail_unreadable(row, worker, exc)
                refused.append(NotStarted(row["id"], row["claim_epoch"], "unreadable",
                                          RunState.RUNNING))
        got = {(s.run_id, s.epoch) for s in started} | {(u.run_id, u.epoch) for u in refused}
        missing = [m for m in messages if (m.run_id, m.epoch) not in got]
        if not missing:
            return started, refused
        states = {r["id"]: r for r in await self._pool.fetch(
            RUN_STATES, [m.run_id for m in missing])}
        not_started = []
        for m in missing:
            row = states.get(m.run_id)
            if row is None:
                not_started.append(NotStarted(m.run_id, m.epoch, "unknown", None))
                continue
            state = RunState(row["state"])
            if state.terminal:
                reason = "terminal"
            elif row["claim_epoch"] != m.epoch:
                reason = "stale"
            elif state is RunState.RUNNING:
                reason = "owned"
            else:
                reason = "stale"
            not_started.append(NotStarted(m.run_id, m.epoch, reason, state))
        return started, refused + not_started

    async def _fail_unreadable(self, row: asyncpg.Record, worker: str,
                               exc: Exception) -> None:
        retry = timedelta(seconds=5) if row["attempt"] < row["max_attempts"] else None
        error = f"stored job definition unreadable by this worker: {exc!r}"[:1000]
        log.error("job definition unreadable; attempt failed", run_id=row["id"],
                  job=row["name"], error=error)
        await self.complete_runs([Completion(
            row["id"], row["claim_epoch"], ExecutionResult(Outcome.FAILED, error=error),
            retry, worker)])

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int:
        """Hand runs this worker could not finish back to pending (clean shutdown)."""
        if not runs:
            return 0
        rows = await self._pool.fetch(INTERRUPT_RUNS, worker, [r for r, _ in runs],
                                      [e for _, e in runs])
        return len(rows)

    async def extend_leases(self, worker: str, runs: Sequence[tuple[str, int]],
                            lease: timedelta) -> set[tuple[str, int]]:
        if not runs:
            return set()
        rows = await self._pool.fetch(EXTEND_LEASES, worker, [r for r, _ in runs],
                                      [e for _, e in runs], lease)
        return {(r["id"], r["claim_epoch"]) for r in rows}

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        if not completions:
            return set()
        with _rejections():
            rows = await self._pool.fetch(
                COMPLETE_RUNS_UNFENCED if os.environ.get("CLAIMD_FAULT_SKIP_EPOCH_GUARD") == "1"
                else COMPLETE_RUNS,
                [c.run_id for c in completions],
                [c.epoch for c in completions],
                [c.result.outcome.value for c in completions],
                [c.result.exit_code for c in completions],
                [_pg_text(c.result.error) for c in completions],
                [_pg_text(c.result.output_tail) for c in completions],
                [None if c.retry_delay is None else c.retry_delay.total_seconds()
                 for c in completions],
                [c.worker for c in completions],
            )
        return {(r["run_id"], r["claim_epoch"]) for r in rows}

    async def cancel_orphaned_runs(self) -> int:
        """Cancel pending runs of jobs no longer in the config."""
        return len(await self._pool.fetch(CANCEL_ORPHANED_RUNS))

    async def prune_history(self, older_than: timedelta, batch: int) -> int:
        """Delete up to ``batch`` terminal runs finished before ``now - older_than``."""
        status = await self._pool.execute(PRUNE_HISTORY, older_than, batch)
        return int(status.split()[-1])

    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]:
        rows = await self._pool.fetch(REAP_EXPIRED_LEASES, limit)
        return [(r["id"], r["name"], f"{r['from_state']}->{r['to_state']}") for r in rows]

    async def cluster_figures(self, timeout: float) -> ClusterReading:
        """The cluster-wide figures /metrics reports (every replica reads the same)."""
        async with self._pool.acquire(timeout=timeout) as conn:
            jobs = await conn.fetch(CLUSTER_JOB_FIGURES, timeout=timeout)
            leases = await conn.fetchrow(CLUSTER_LEASE_FIGURES, timeout=timeout)
        assert leases is not None
        return ClusterReading(
            jobs=tuple(JobReading(
                name=r["name"], paused=r["paused"], fingerprint=r["fingerprint"],
                definition=r["definition"], last_success=r["last_success"],
                last_failure=r["last_failure"], overdue=r["overdue"],
                overdue_oldest_age=r["overdue_oldest_age"],
                materialized_behind=r["materialized_behind"]) for r in jobs),
            claimed=leases["claimed"], running=leases["running"],
            past_lease=leases["past_lease"])


# --- operator actions ---------------------------------------------------------

SET_PAUSED = """
UPDATE jobs SET paused = $2, updated_at = now() WHERE name = $1 AND enabled RETURNING id
"""
JOB_BY_NAME = "SELECT id, definition, enabled FROM jobs WHERE name = $1"
# An ad-hoc or backfilled run is still one row per (job, instant): a repeated
# trigger for the same instant, or a second backfill, inserts nothing.
INSERT_RUNS_AT = """
INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger)
SELECT $1, t, now(), $3 FROM unnest($2::timestamptz[]) AS t
ON CONFLICT ON CONSTRAINT job_runs_one_row_per_instant DO NOTHING
RETURNING id::text
"""
# Cancelling a running run takes its lease away: the worker's next heartbeat
# is refused, it cancels the execution, and its completion is fenced.
CANCEL_RUN = """
UPDATE job_runs SET state = 'cancelled', outcome = 'cancelled', error = $2,
       finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
 WHERE id = $1::uuid AND state IN ('pending', 'claimed', 'running')
RETURNING id::text
"""
# Retention: terminal history older than the cut-off, a small batch at a time
# so that pruning never holds many locks or a long transaction. SKIP LOCKED:
# replicas pruning at once take disjoint batches and never wait on each other.
PRUNE_HISTORY = """
DELETE FROM job_runs WHERE id IN (
    SELECT id FROM job_runs
     WHERE finished_at < now() - $1::interval
       AND state IN ('succeeded', 'failed', 'skipped', 'cancelled')
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED)
"""


class UnknownJob(LookupError):
    """An operator action named a job the config file never declared."""


# A backfill writes its rows in statements of this many instants: a long range
# is many short statements (bounded memory, no lock held for minutes), and one
# interrupted half-way is finished by running it again (the rows are idempotent).
BACKFILL_CHUNK = 10_000
# What one backfill may add unless told otherwise: a range typed wrong (years of
# a job every second) is refused before anything is written.
BACKFILL_MAX_RUNS = 1_000_000


@dataclass(frozen=True)
class BackfillProgress:
    """How far a backfill has come: after each chunk, and (covered == instants) at the end."""

    job: str
    instants: int  # instants of the schedule in the range
    covered: int  # instants written or found already written so far
    added: int  # rows inserted so far
    through: datetime | None  # the last instant covered

    @property
    def existing(self) -> int:
        """Instants covered that already had a row (any trigger), so were left alone."""
        return self.covered - self.added


class BackfillTooLarge(ValueError):
    """A backfill range holds more instants than allowed; nothing was written."""

    def __init__(self, job: str, instants: int, exact: bool, limit: int) -> None:
        self.job, self.instants, self.exact, self.limit = job, instants, exact, limit
        count = f"{instants:,}" if exact else f"more than {limit:,}"
        super().__init__(f"backfill of {job!r} covers {count} instants, over the limit of "
                         f"{limit:,} runs per backfill")


def _count_instants(schedule: Schedule, after: datetime, until: datetime,
                    ceiling: int) -> tuple[int, bool]:
    """Instants in ``(after, until]``: (count, exact); counting stops past ``ceiling``.

    An interval schedule is counted by arithmetic (exact, whatever the size);
    any other is walked, and a count past the ceiling is a lower bound.
    """
    if isinstance(schedule, IntervalSchedule):
        us = timedelta(microseconds=1)
        step = schedule.every // us
        first = (after - schedule.anchor) // us // step + 1  # k * step > after
        last = (until - schedule.anchor) // us // step  # k * step <= until
        return max(0, last - first + 1), True
    count = 0
    for _ in schedule.fire_times(after, until):
        count += 1
        if count > ceiling:
            return count, False
    return count, True


class Operations:
    """What an operator can do to jobs and runs. Nothing here can define a command."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def _job(self, name: str) -> asyncpg.Record:
        row = await self._pool.fetchrow(JOB_BY_NAME, name)
        if row is None or not row["enabled"]:
            raise UnknownJob(f"no enabled job named {name!r}")
        return row

    async def pause(self, job: str) -> None:
        if await self._pool.fetchval(SET_PAUSED, job, True) is None:
            raise UnknownJob(f"no enabled job named {job!r}")

    async def resume(self, job: str) -> None:
        if await self._pool.fetchval(SET_PAUSED, job, False) is None:
            raise UnknownJob(f"no enabled job named {job!r}")

    async def trigger(self, job: str, at: datetime) -> str | None:
        """A run of ``job`` for instant ``at``, due now; None if that instant has a row."""
        row = await self._job(job)
        ids = await self._pool.fetch(INSERT_RUNS_AT, row["id"], [at], "manual")
        return ids[0]["id"] if ids else None

    async def backfill(self, job: str, start: datetime, end: datetime, *,
                       max_runs: int = BACKFILL_MAX_RUNS, chunk: int = BACKFILL_CHUNK,
                       progress: Callable[[BackfillProgress], None] | None = None,
                       ) -> BackfillProgress:
        """One run per instant of the schedule in ``[start, end]`` that has no row yet.

        The whole range, however long, in statements of ``chunk`` instants each
        (``progress`` is told after each one); or BackfillTooLarge, before
        anything is written, when the range holds more than ``max_runs`` instants.
        """
        row = await self._job(job)
        schedule = schedule_from_definition(json.loads(row["definition"])["schedule"])
        after = start - timedelta(microseconds=1)  # fire_times excludes its start
        total, exact = _count_instants(schedule, after, end, max_runs)
        if total > max_runs:
            raise BackfillTooLarge(job, total, exact, max_runs)
        done = BackfillProgress(job, total, 0, 0, None)
        instants = schedule.fire_times(after, end)
        while batch := take(instants, chunk):
            inserted = await self._pool.fetch(INSERT_RUNS_AT, row["id"], batch, "backfill")
            done = BackfillProgress(job, total, done.covered + len(batch),
                                    done.added + len(inserted), batch[-1])
            if progress is not None:
                progress(done)
        return done

    async def cancel(self, run_id: str, reason: str = "cancelled by operator") -> bool:
        return await self._pool.fetchval(CANCEL_RUN, run_id, reason) is not None

    async def prune(self, older_than: timedelta, batch: int = 1000) -> int:
        return await PostgresRunStore(self._pool).prune_history(older_than, batch)


# SQLSTATE classes that mean "try again later": connection exceptions,
# operator intervention (shutdown, cannot connect now), insufficient resources,
# transaction rollback (serialization failure, deadlock).
_TRANSIENT_CLASSES = ("08", "57", "53", "40")
# read_only_sql_transaction: what a server that was just demoted in a failover says.
_TRANSIENT_STATES = ("25006",)


@contextlib.contextmanager
def _rejections() -> Iterator[None]:
    """Turn errors about the data itself into RecordRejected; let transient ones through."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", "") or ""
        if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
            raise
        raise RecordRejected(f"{type(exc).__name__}: {exc}") from exc


def _record_skip(run_id: str, job: str, reason: str, where: str) -> None:
    RUNS_SKIPPED.inc()
    log.info("run skipped", run_id=run_id, job=job, reason=reason, judged_at=where)


def _claimed_or_skipped(rows: Sequence[asyncpg.Record]) -> list[ClaimedRun]:
    """The runs a claim statement claimed; those it recorded skipped are logged and counted."""
    claimed = []
    for r in rows:
        if r["skip"] is not None:
            _record_skip(r["id"], r["name"], r["skip"], "claim")
            continue
        claimed.append(ClaimedRun(run_id=r["id"], job=r["name"], scheduled_at=r["scheduled_at"],
                                  attempt=r["attempt"], epoch=r["claim_epoch"]))
    return claimed


def _pg_text(value: str | None) -> str | None:
    # PostgreSQL text cannot hold NUL, and UTF-8 cannot hold a lone surrogate
    # (a Python exception message may): either would make the database refuse
    # the completion on every retry.
    if value is None:
        return None
    return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _started_run(row: asyncpg.Record) -> StartedRun:
    definition: dict[str, Any] = json.loads(row["definition"])
    retry = definition.get("retry", {})
    policy = RetryPolicy(
        initial=timedelta(milliseconds=retry.get("initial_ms", 1000)),
        maximum=timedelta(milliseconds=retry.get("maximum_ms", 300_000)),
        multiplier=float(retry.get("multiplier", 2.0)),
    )
    return StartedRun(
        run_id=row["id"], epoch=row["claim_epoch"], job=row["name"],
        scheduled_at=row["scheduled_at"], attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        executor=executor_from_dict(definition["executor"]),
        timeout=timedelta(milliseconds=definition.get("timeout_ms", 3_600_000)),
        retry_delay=policy.delay(row["attempt"], row["id"]),
        trigger=row["trigger"], due_at=row["due_at"],
    )


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb as text both ways: we decode where needed, and never build SQL from it.
    await conn.set_type_codec("jsonb", encoder=str, decoder=str, schema="pg_catalog")

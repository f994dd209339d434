"""Every statement claimd runs, as named, parameterised constants, by area.

The comment above each statement says why it is written that way; keep them
together. Never build SQL from input: the only splicing is of constants.
"""

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
# The lock CTE names the rows by id, and carries the caller's values for
# them (the unnest joined by id: the message's epoch, a verdict); the guards
# (state, epoch, owner) stay in the UPDATE's WHERE, which READ COMMITTED
# re-evaluates on the latest row version, the one the CTE locked. (A guard in
# the CTE too would make the planner estimate its size from stale state
# statistics, often one row, and then pick a nested loop over the whole leased
# set for the UPDATE.) The UPDATE joins the CTE alone, by id: a row it changes
# is then always one the CTE locked first, in order. Joined to the unnest as
# well (unnest x CTE x table), the planner estimated the (id, epoch) match at
# one row once the table had statistics and compared every row of the CTE
# with every other: quadratic in the batch (a START_RUNS of 1,000 runs took
# 250 ms instead of 40, one of 2,500 a second and a half).

from actors.adapters.postgres.statements.claim import (
    CANCEL_ORPHANED_RUNS,
    CLAIM_DUE_RUNS,
    CLAIM_EXCLUSIVE_RUNS,
    COUNT_CLAIMED,
    NEXT_DUE_IN,
    PENDING_CHANNEL,
    RELEASE_UNPUBLISHED,
    SKIP_UNRUNNABLE,
)
from actors.adapters.postgres.statements.history import (
    ACTIONS_PAGE,
    AUDIT_GAPS,
    AUDIT_RUNS,
    DB_NOW,
    GRID_GAPS,
    GRID_PAUSES,
    GRID_RUNS,
    JOB_RECORD,
    JOBS_OVERVIEW,
    LAST_ACTION_ID,
    PAUSES,
    RECORD_ACTION,
    RECORD_GAPS,
    REJECTED_JOBS,
    RELOAD_VERDICT,
    RUN_ATTEMPTS,
    RUN_DETAIL,
    RUNS_PAGE,
    TERMINAL,
)
from actors.adapters.postgres.statements.jobs import (
    ACTIVE_JOBS,
    ADVANCE_MARKS_TO_REMOVAL,
    CATALOG_VERSION,
    CLEAR_REJECTED_JOBS,
    DATABASE_NOW,
    DISABLE_REMOVED_JOBS,
    INSERT_RUNS_UNTIL_REMOVAL,
    JOBS_AS_SYNCED,
    LOCK_JOBS_FOR_SYNC,
    LOCK_SYNC,
    OLD_SCHEDULES,
    RECORD_REJECTED_JOBS,
    REMOVED_JOBS,
    REMOVED_JOBS_TO_PLAN,
    RESTORE_READDED_JOB,
    TRY_LOCK_SYNC,
    UPSERT_JOBS,
    WITHDRAW_FUTURE_RUNS,
)
from actors.adapters.postgres.statements.materialize import (
    ADVANCE_HIGH_WATER,
    CURRENT_MARKS,
    INSERT_PLANNED_RUNS,
    PLAN_IS_FRESH,
)
from actors.adapters.postgres.statements.metrics import (
    CLUSTER_JOB_FIGURES,
    CLUSTER_LEASE_FIGURES,
)
from actors.adapters.postgres.statements.operator import (
    ACTIVE_RUN,
    CANCEL_RUN,
    INSERT_RUNS_AT,
    JOB_BY_NAME,
    LOCK_JOB,
    MOVE_MARK_TO_NOW,
    PAUSED_JOB,
    PRUNE_HISTORY,
    RUN_JOB,
    RUN_STATE,
    SET_PAUSED,
    SKIP_PAUSED_RUNS,
)
from actors.adapters.postgres.statements.reaper import APPLY_REAPED, LOCK_EXPIRED_LEASES
from actors.adapters.postgres.statements.worker import (
    APPLY_INTERRUPTED,
    COMPLETE_RUNS,
    EXTEND_LEASES,
    LOCK_INTERRUPTED,
    RUN_STATES,
    START_RUNS,
)

__all__ = [
    "ACTIONS_PAGE",
    "ACTIVE_JOBS",
    "ACTIVE_RUN",
    "ADVANCE_HIGH_WATER",
    "ADVANCE_MARKS_TO_REMOVAL",
    "APPLY_INTERRUPTED",
    "APPLY_REAPED",
    "AUDIT_GAPS",
    "AUDIT_RUNS",
    "CANCEL_ORPHANED_RUNS",
    "CANCEL_RUN",
    "CATALOG_VERSION",
    "CLAIM_DUE_RUNS",
    "CLAIM_EXCLUSIVE_RUNS",
    "CLEAR_REJECTED_JOBS",
    "CLUSTER_JOB_FIGURES",
    "CLUSTER_LEASE_FIGURES",
    "COMPLETE_RUNS",
    "COUNT_CLAIMED",
    "CURRENT_MARKS",
    "DATABASE_NOW",
    "DB_NOW",
    "DISABLE_REMOVED_JOBS",
    "EXTEND_LEASES",
    "GRID_GAPS",
    "GRID_PAUSES",
    "GRID_RUNS",
    "INSERT_PLANNED_RUNS",
    "INSERT_RUNS_AT",
    "INSERT_RUNS_UNTIL_REMOVAL",
    "JOBS_AS_SYNCED",
    "JOBS_OVERVIEW",
    "JOB_BY_NAME",
    "JOB_RECORD",
    "LAST_ACTION_ID",
    "LOCK_EXPIRED_LEASES",
    "LOCK_INTERRUPTED",
    "LOCK_JOB",
    "LOCK_JOBS_FOR_SYNC",
    "LOCK_SYNC",
    "MOVE_MARK_TO_NOW",
    "NEXT_DUE_IN",
    "OLD_SCHEDULES",
    "PAUSED_JOB",
    "PAUSES",
    "PENDING_CHANNEL",
    "PLAN_IS_FRESH",
    "PRUNE_HISTORY",
    "RECORD_ACTION",
    "RECORD_GAPS",
    "RECORD_REJECTED_JOBS",
    "REJECTED_JOBS",
    "RELEASE_UNPUBLISHED",
    "RELOAD_VERDICT",
    "REMOVED_JOBS",
    "REMOVED_JOBS_TO_PLAN",
    "RESTORE_READDED_JOB",
    "RUNS_PAGE",
    "RUN_ATTEMPTS",
    "RUN_DETAIL",
    "RUN_JOB",
    "RUN_STATE",
    "RUN_STATES",
    "SET_PAUSED",
    "SKIP_PAUSED_RUNS",
    "SKIP_UNRUNNABLE",
    "START_RUNS",
    "TERMINAL",
    "TRY_LOCK_SYNC",
    "UPSERT_JOBS",
    "WITHDRAW_FUTURE_RUNS",
]

"""PostgreSQL: the store of truth (asyncpg), split by job.

- ``pool``: connections with deadlines (connect host by host, TCP keepalive).
- ``errors``: which errors are an outage (StoreUnavailable) and which are about the data.
- ``migrations``: the numbered migrations in sql/.
- ``statements``: every statement claimd runs, as named constants, by area.
- ``catalog``: the job catalog (sync the config's jobs, read the active ones, write plans).
- ``verdicts``: attempt verdicts applied (completions, the reaper's pass, a stop's hand-back).
- ``run_store``: the RunStore port (claim, start, heartbeat, complete, release, reap).
- ``operations``: operator actions (pause, resume, trigger, backfill's inserts, cancel).
- ``history``: the operator's reads (runs, attempts, gaps, actions), gaps and the action log.
- ``operator_store``: the operator's port (actors.ports.operator): the reads, each action
  recorded with it.

The names callers use are re-exported here.
"""

from actors.adapters.postgres.catalog import PostgresJobCatalog
from actors.adapters.postgres.errors import POSTGRES_HEALTH, is_outage, is_unreachable
from actors.adapters.postgres.migrations import migrate, migration_files
from actors.adapters.postgres.operations import Operations, UnknownJob
from actors.adapters.postgres.operator_store import PostgresOperatorStore
from actors.adapters.postgres.pool import connect_pool, split_hosts
from actors.adapters.postgres.run_store import PostgresRunStore
from actors.adapters.postgres.statements import (
    CLAIM_DUE_RUNS,
    CLAIM_EXCLUSIVE_RUNS,
    COMPLETE_RUNS,
)
from actors.domain.backfill import (
    BACKFILL_CHUNK,
    BACKFILL_MAX_RUNS,
    BackfillProgress,
    BackfillTooLarge,
)

__all__ = [
    "BACKFILL_CHUNK",
    "BACKFILL_MAX_RUNS",
    "CLAIM_DUE_RUNS",
    "CLAIM_EXCLUSIVE_RUNS",
    "COMPLETE_RUNS",
    "POSTGRES_HEALTH",
    "BackfillProgress",
    "BackfillTooLarge",
    "Operations",
    "PostgresJobCatalog",
    "PostgresOperatorStore",
    "PostgresRunStore",
    "UnknownJob",
    "connect_pool",
    "is_outage",
    "is_unreachable",
    "migrate",
    "migration_files",
    "split_hosts",
]

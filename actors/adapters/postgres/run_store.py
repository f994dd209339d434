"""The run store: claims, starts, heartbeats, completions, releases and the reaper's pass.

Every state change is one guarded UPDATE whose returned rows say whether it
happened. Time comes from the database (``now()``), so replicas with skewed
clocks still agree on leases and due times.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Self

import asyncpg

from actors.adapters.postgres import verdicts
from actors.adapters.postgres.catalog import PostgresJobCatalog
from actors.adapters.postgres.errors import POSTGRES, POSTGRES_HEALTH, is_outage, reads_only
from actors.adapters.postgres.migrations import migrate
from actors.adapters.postgres.pool import connect_pool, init_connection
from actors.adapters.postgres.statements import (
    CANCEL_ORPHANED_RUNS,
    CLAIM_DUE_RUNS,
    CLAIM_EXCLUSIVE_RUNS,
    CLUSTER_JOB_FIGURES,
    CLUSTER_LEASE_FIGURES,
    COUNT_CLAIMED,
    EXTEND_LEASES,
    NEXT_DUE_IN,
    PRUNE_HISTORY,
    RELEASE_UNPUBLISHED,
    RUN_STATES,
    SKIP_UNRUNNABLE,
    START_RUNS,
)
from actors.domain import (
    DEFAULT_TIMEOUTS,
    ClaimedRun,
    DecodedJobs,
    ExecutionResult,
    Job,
    Outcome,
    RunState,
    SkipReason,
    StartRefusal,
    TimeoutBudget,
    decide_attempt,
    refusal_of,
)
from actors.domain.defaults import OVERDUE_AFTER
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.observability import RUNS_SKIPPED, get_logger
from actors.ports import (
    ClusterReading,
    Completion,
    DispatchMessage,
    JobReading,
    NotStarted,
    StartedRun,
)
from actors.ports.translator import speaks_the_port

log = get_logger("postgres")


@speaks_the_port(POSTGRES)
class PostgresRunStore(PostgresJobCatalog):
    """RunStore on PostgreSQL through an asyncpg pool."""

    def __init__(
        self, pool: asyncpg.Pool, close_timeout: timedelta = DEFAULT_TIMEOUTS.close_timeout
    ) -> None:
        super().__init__(pool)
        self._close_timeout = close_timeout
        # Each stored definition decoded once, not once per run started.
        # Every job a worker starts, decoded once: at 10,000 jobs a smaller cache
        # decoded most of a herd's definitions again at every instant.
        self._decoded = DecodedJobs(size=100_000)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeouts: TimeoutBudget = DEFAULT_TIMEOUTS,
    ) -> Self:
        """A pool whose every call has a deadline from ``timeouts`` (see connect_pool)."""
        pool = await connect_pool(
            dsn, timeouts, min_size=min_size, max_size=max_size, init=init_connection
        )
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
        except (
            TimeoutError,
            OSError,
            asyncpg.PostgresError,
            asyncpg.exceptions.InterfaceError,
        ) as exc:
            log.warning(
                "database pool did not close in time; terminated",
                waited_s=self._close_timeout.total_seconds(),
                error=repr(exc),
            )
            self._pool.terminate()

    async def migrate(self) -> list[str]:
        async with self._pool.acquire() as conn:
            try:
                return await migrate(conn)
            finally:
                # The migration lock is the one session state a pooled
                # connection ever holds, and the pool does not reset sessions
                # (pool.keep_session): this one is reset in full.
                with contextlib.suppress(Exception):
                    await conn.reset()

    @reads_only
    async def ping(self) -> None:
        await self._pool.fetchval("SELECT 1")

    async def skip_unrunnable(self, limit: int) -> list[tuple[str, SkipReason]]:
        """Record as skipped the due runs that policies say must not run."""
        rows = await self._pool.fetch(SKIP_UNRUNNABLE, limit)
        return [(r["id"], SkipReason(r["reason"])) for r in rows]

    async def claim_due_runs(
        self,
        owner: str,
        limit: int,
        lease: timedelta,
        max_claimed: int,
        ahead: timedelta = timedelta(0),
    ) -> list[ClaimedRun]:
        # No lock around the claim: replicas race, and SKIP LOCKED keeps their
        # batches disjoint. The in-flight bound is counted just before, so R
        # replicas claiming at the same instant can overshoot it by at most
        # (R - 1) x limit; it bounds queue wait, it is not a quota.
        # (A cluster-wide lock would make it exact, and would let one paused
        # replica holding it stop every claim.)
        room = min(limit, max(0, max_claimed - await self._pool.fetchval(COUNT_CLAIMED)))
        claimed = _claimed_or_skipped(
            await self._pool.fetch(CLAIM_DUE_RUNS, owner, room, lease, ahead) if room else []
        )
        try:
            claimed += _claimed_or_skipped(
                await self._pool.fetch(CLAIM_EXCLUSIVE_RUNS, owner, limit, lease, ahead)
            )
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
            if not claimed or not is_outage(exc):
                raise
            log.warning(
                "exclusive claim failed (database unavailable); passing on the other claims",
                error=repr(exc),
            )
        return claimed

    @reads_only
    async def next_due_in(self, ahead: timedelta) -> timedelta | None:
        seconds = await self._pool.fetchval(NEXT_DUE_IN, ahead)
        return None if seconds is None else timedelta(seconds=seconds)

    async def release_unpublished(self, owner: str, runs: Sequence[ClaimedRun]) -> int:
        rows = await self._pool.fetch(
            RELEASE_UNPUBLISHED, owner, [r.run_id for r in runs], [r.epoch for r in runs]
        )
        return len(rows)

    async def start_runs(
        self,
        worker: str,
        messages: Sequence[DispatchMessage],
        lease: timedelta,
        *,
        retake: Collection[tuple[str, int]] = (),
    ) -> tuple[list[StartedRun], list[NotStarted]]:
        if not messages:
            return [], []
        ids = [m.run_id for m in messages]
        rows = await self._pool.fetch(
            START_RUNS,
            ids,
            [m.epoch for m in messages],
            worker,
            lease,
            [(m.run_id, m.epoch) in retake for m in messages],
        )
        started: list[StartedRun] = []
        refused: list[NotStarted] = []
        for row in rows:
            if row["skipped"] is not None:
                # Judged again at the start and found unrunnable (it waited in
                # the stream past its deadline, or was superseded): recorded
                # skipped; the delivery changed nothing.
                _record_skip(row["id"], row["name"], row["skipped"], "start")
                refused.append(
                    NotStarted(
                        row["id"], row["claim_epoch"], StartRefusal.SKIPPED, RunState.SKIPPED
                    )
                )
                continue
            try:
                job = self._decoded.job(row["name"], row["fingerprint"], row["definition"])
                started.append(_started_run(row, job))
            except (KeyError, ValueError, TypeError) as exc:
                # A definition this build cannot read (written by a newer one?):
                # fail this attempt on the record, retry it if attempts remain,
                # and let the rest of the batch run.
                await self._fail_unreadable(row, worker, exc)
                refused.append(
                    NotStarted(
                        row["id"], row["claim_epoch"], StartRefusal.UNREADABLE, RunState.RUNNING
                    )
                )
        got = {(s.run_id, s.epoch) for s in started} | {(u.run_id, u.epoch) for u in refused}
        missing = [m for m in messages if (m.run_id, m.epoch) not in got]
        if not missing:
            return started, refused
        states = {
            r["id"]: r for r in await self._pool.fetch(RUN_STATES, [m.run_id for m in missing])
        }
        not_started = []
        for m in missing:
            row = states.get(m.run_id)
            state = None if row is None else RunState(row["state"])
            epoch = None if row is None else row["claim_epoch"]
            not_started.append(
                NotStarted(m.run_id, m.epoch, refusal_of(state, epoch, m.epoch), state)
            )
        return started, refused + not_started

    async def _fail_unreadable(self, row: asyncpg.Record, worker: str, exc: Exception) -> None:
        # No policy to follow (it is in the definition that cannot be read).
        verdict = decide_attempt(
            Outcome.FAILED,
            state=RunState.RUNNING,
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            policy=None,
            run_id=row["id"],
        )
        error = f"stored job definition unreadable by this worker: {exc!r}"[:1000]
        log.error(
            "job definition unreadable; attempt failed",
            run_id=row["id"],
            job=row["name"],
            error=error,
        )
        await self.complete_runs(
            [
                Completion(
                    row["id"],
                    row["claim_epoch"],
                    ExecutionResult(Outcome.FAILED, error=error),
                    verdict,
                    worker,
                )
            ]
        )

    async def interrupt_runs(self, worker: str, runs: Sequence[tuple[str, int]]) -> int:
        """Hand runs this worker could not finish back (clean shutdown), as the domain says."""
        return await verdicts.interrupt(self._pool, worker, runs)

    async def extend_leases(
        self, worker: str, runs: Sequence[tuple[str, int]], lease: timedelta
    ) -> set[tuple[str, int]]:
        if not runs:
            return set()
        rows = await self._pool.fetch(
            EXTEND_LEASES, worker, [r for r, _ in runs], [e for _, e in runs], lease
        )
        return {(r["id"], r["claim_epoch"]) for r in rows}

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        return await verdicts.complete(self._pool, completions)

    async def cancel_orphaned_runs(self) -> int:
        """Cancel pending runs of jobs no longer in the config."""
        return len(await self._pool.fetch(CANCEL_ORPHANED_RUNS, REMOVED_FROM_CONFIG))

    async def prune_history(self, older_than: timedelta, batch: int) -> int:
        """Delete up to ``batch`` terminal runs finished before ``now - older_than``."""
        pruned: int = await self._pool.fetchval(PRUNE_HISTORY, older_than, batch)
        return pruned

    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]:
        """Runs whose lease expired: each one's verdict decided by the domain, applied in SQL."""
        return await verdicts.reap(self._pool, limit)

    @reads_only
    async def cluster_figures(self, timeout: float) -> ClusterReading:
        """The cluster-wide figures /metrics reports (every replica reads the same)."""
        async with self._pool.acquire(timeout=timeout) as conn:
            jobs = await conn.fetch(CLUSTER_JOB_FIGURES, OVERDUE_AFTER, timeout=timeout)
            leases = await conn.fetchrow(CLUSTER_LEASE_FIGURES, timeout=timeout)
        assert leases is not None
        definitions = await self._definitions.of(self._pool, jobs)
        return ClusterReading(
            jobs=tuple(
                JobReading(
                    name=r["name"],
                    paused=r["paused"],
                    fingerprint=r["fingerprint"],
                    definition=definitions.get(r["id"]),
                    last_success=r["last_success"],
                    last_failure=r["last_failure"],
                    overdue=r["overdue"],
                    overdue_oldest_age=r["overdue_oldest_age"],
                    materialized_behind=r["materialized_behind"],
                    last_state=r["last_state"],
                    running=r["running"],
                    rejected=r["rejected"],
                )
                for r in jobs
            ),
            claimed=leases["claimed"],
            running=leases["running"],
            past_lease=leases["past_lease"],
        )


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
        claimed.append(
            ClaimedRun(
                run_id=r["id"],
                job=r["name"],
                scheduled_at=r["scheduled_at"],
                attempt=r["attempt"],
                epoch=r["claim_epoch"],
                due_at=r["due_at"],
                executor=r.get("executor"),
            )
        )
    return claimed


def _started_run(row: asyncpg.Record, job: Job) -> StartedRun:
    return StartedRun(
        run_id=row["id"],
        epoch=row["claim_epoch"],
        job=row["name"],
        scheduled_at=row["scheduled_at"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        executor=job.executor,
        timeout=job.timeout,
        retry=job.retry,
        trigger=row["trigger"],
        due_at=row["due_at"],
    )

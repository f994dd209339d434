"""Operator actions on jobs and runs: pause, resume, trigger, backfill's inserts, cancel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg

from actors.adapters.postgres.history import record_gaps
from actors.adapters.postgres.run_store import PostgresRunStore
from actors.adapters.postgres.statements import (
    CANCEL_RUN,
    INSERT_RUNS_AT,
    JOB_BY_NAME,
    MOVE_MARK_TO_NOW,
    PAUSED_JOB,
    SET_PAUSED,
    SKIP_PAUSED_RUNS,
)
from actors.domain import Overlap, decode_job, format_duration
from actors.domain.backfill import (
    BACKFILL_CHUNK,
    BACKFILL_MAX_RUNS,
    BackfillProgress,
    plan_backfill,
)
from actors.domain.pause import PausedInstants, instants_between, paused_gaps, skipped_reason
from actors.ports import Resumed, UnknownJob  # the port's: raised and answered through it


def _text(overlap: Overlap | None) -> str | None:
    return None if overlap is None else overlap.value


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

    async def resume(
        self, job: str, paused_instants: PausedInstants = PausedInstants.RUN, actor: str = "?"
    ) -> Resumed:
        """Unpause ``job``; with SKIP, none of the instants due meanwhile runs.

        Run in the caller's transaction, the job row locked: the skipped runs,
        the gaps, the mark and the flag change together or not at all.
        """
        row = await self._pool.fetchrow(PAUSED_JOB, job)
        if row is None:
            raise UnknownJob(f"no enabled job named {job!r}")
        decoded = decode_job(job, row["definition"])
        schedule = decoded.schedule
        policy = (
            f'catchup = "{decoded.catchup.value}", '
            f'catchup_window = "{format_duration(decoded.catchup_window)}"'
        )
        now, since = row["now"], row["paused_at"]
        # Where the materializer would plan from: its mark, or (never planned) the job's start.
        mark = row["materialized_until"] or min(row["created_at"], now)
        unwritten = instants_between(schedule, mark, now)
        done = Resumed(policy, since, now, row["due_now"], unwritten.count if unwritten else 0)
        if paused_instants is PausedInstants.SKIP:
            reason = skipped_reason(since, now, actor)
            earliest = since or datetime.min.replace(tzinfo=UTC)
            skipped = await self._pool.fetchval(SKIP_PAUSED_RUNS, row["id"], earliest, reason)
            gaps = paused_gaps(schedule, mark, since, now, actor)
            await record_gaps(self._pool, [row["id"]], [(row["id"], g) for g in gaps])
            await self._pool.execute(MOVE_MARK_TO_NOW, row["id"])
            done = replace(done, runs_skipped=skipped, gaps=tuple(gaps))
        if await self._pool.fetchval(SET_PAUSED, job, False) is None:
            raise UnknownJob(f"no enabled job named {job!r}")
        return done

    async def trigger(self, job: str, at: datetime, overlap: Overlap | None = None) -> str | None:
        """A run of ``job`` for instant ``at``, due now; None if that instant has a row.

        ``overlap``: the run's own overlap mode (None: the job's).
        """
        row = await self._job(job)
        ids = await self._pool.fetch(INSERT_RUNS_AT, row["id"], [at], "manual", _text(overlap))
        return ids[0]["id"] if ids else None

    async def backfill(
        self,
        job: str,
        start: datetime,
        end: datetime,
        *,
        max_runs: int = BACKFILL_MAX_RUNS,
        chunk: int = BACKFILL_CHUNK,
        progress: Callable[[BackfillProgress], None] | None = None,
        overlap: Overlap | None = None,
    ) -> BackfillProgress:
        """One run per instant of the schedule in ``[start, end]`` that has no row yet.

        The whole range, however long, in statements of ``chunk`` instants each
        (``progress`` is told after each one); or BackfillTooLarge, before
        anything is written, when the range holds more than ``max_runs`` instants.
        ``overlap``: the runs' own overlap mode (None: the job's).
        """
        row = await self._job(job)
        schedule = decode_job(job, row["definition"]).schedule
        plan = plan_backfill(job, schedule, start, end, max_runs)
        done = plan.nothing_done()
        for batch in plan.chunks(chunk):
            inserted = await self._pool.fetch(
                INSERT_RUNS_AT, row["id"], batch, "backfill", _text(overlap)
            )
            done = done.after_chunk(batch, len(inserted))
            if progress is not None:
                progress(done)
        return done

    async def cancel(self, run_id: str, reason: str = "cancelled by operator") -> bool:
        return await self._pool.fetchval(CANCEL_RUN, run_id, reason) is not None

    async def prune(self, older_than: timedelta, batch: int = 1000) -> int:
        return await PostgresRunStore(self._pool).prune_history(older_than, batch)

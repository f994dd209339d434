"""What a contract test reads and sets beside the port, on each store's own rows.

The port is the thing under test; these helpers only arrange rows (a run due a
minute ago, a lease that ran out) and read them back. On PostgreSQL they are
SQL on the test's schema, relative to the database's now() (no sleep: a lease
runs out because its row says so); in memory they touch the rows on the
store's manual clock.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import asyncpg

from actors.adapters.postgres import PostgresRunStore
from actors.adapters.postgres.operations import Operations
from actors.domain import Overlap, RunState
from actors.ports import StoreUnavailable
from actors.testing.memory import InMemoryRunStore, ManualClock


@dataclass(frozen=True)
class Row:
    """One job_runs row as a test compares it across stores."""

    state: RunState
    attempt: int
    epoch: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    scheduled_at: datetime
    due_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str | None
    error: str | None


class Rows(Protocol):
    """The helpers every store's half of the suite provides."""

    async def insert(
        self,
        job: str,
        scheduled: timedelta = timedelta(0),
        due: timedelta | None = None,
        trigger: str = "schedule",
        overlap: Overlap | None = None,
        attempt: int = 1,
    ) -> str:
        """A pending run of ``job`` at now + ``scheduled``, due at now + ``due`` (default:
        its instant), with its own ``overlap`` mode (None: the job's); its id."""
        ...

    async def force(
        self,
        run_id: str,
        state: RunState,
        *,
        owner: str = "other",
        lease: timedelta = timedelta(minutes=5),
        finished: timedelta = timedelta(0),
    ) -> None:
        """Put the row in ``state`` behind the port's back: leased (claimed, running) by
        ``owner`` until now + ``lease``; finished (terminal) ``finished`` ago."""
        ...

    async def row(self, run_id: str) -> Row | None: ...
    async def expire_lease(self, run_id: str) -> None:
        """The run's lease ran out a second ago."""
        ...

    async def move_instant(self, run_id: str, by: timedelta) -> None:
        """Shift the run's instant (as if it had waited ``-by`` longer)."""
        ...

    async def finished_ago(self, run_id: str, ago: timedelta) -> None: ...
    async def attempts(self, run_id: str) -> list[tuple[int, int, str, str]]:
        """(attempt, epoch, outcome, worker) of the run's recorded attempts, in order."""
        ...

    async def gaps(self, job: str) -> list[tuple[datetime, datetime, int, str]]: ...
    async def set_paused(self, job: str, paused: bool) -> None:
        """The operator's pause or resume (`claimd pause`)."""
        ...

    async def pause_unseen(self, job: str) -> None:
        """The job's row paused, its claims left alone: a pause that committed before a
        claim that had read the job unpaused."""
        ...

    async def make_unreadable(self, job: str) -> None:
        """The stored definition names an executor this build does not know."""
        ...

    async def later(self) -> None:
        """Some time passes on the store's clock (in memory, a second; PostgreSQL's moves
        between statements by itself)."""
        ...

    def unknown_run(self) -> str: ...

    def outage(self) -> AbstractAsyncContextManager[None]:
        """Within it, the store's database is away (every call fails as an outage)."""
        ...


class MemoryRows:
    def __init__(self, store: InMemoryRunStore, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock

    async def insert(
        self,
        job: str,
        scheduled: timedelta = timedelta(0),
        due: timedelta | None = None,
        trigger: str = "schedule",
        overlap: Overlap | None = None,
        attempt: int = 1,
    ) -> str:
        now = self.clock.now()
        due_at = now + (scheduled if due is None else due)
        run = self.store.add_run(
            job, now + scheduled, due_at=due_at, trigger=trigger, overlap=overlap
        )
        run.attempt = attempt
        return run.id

    async def force(
        self,
        run_id: str,
        state: RunState,
        *,
        owner: str = "other",
        lease: timedelta = timedelta(minutes=5),
        finished: timedelta = timedelta(0),
    ) -> None:
        run, now = self.store.runs[run_id], self.clock.now()
        leased = state in (RunState.CLAIMED, RunState.RUNNING)
        run.state = state
        run.lease_owner = owner if leased else None
        run.lease_expires_at = now + lease if leased else None
        run.finished_at = now - finished if state.terminal else None
        run.outcome = state.value if state.terminal else None

    async def row(self, run_id: str) -> Row | None:
        r = self.store.runs.get(run_id)
        if r is None:
            return None
        return Row(
            r.state,
            r.attempt,
            r.epoch,
            r.lease_owner,
            r.lease_expires_at,
            r.scheduled_at,
            r.due_at,
            r.started_at,
            r.finished_at,
            r.outcome,
            r.error,
        )

    async def expire_lease(self, run_id: str) -> None:
        self.store.runs[run_id].lease_expires_at = self.clock.now() - timedelta(seconds=1)

    async def move_instant(self, run_id: str, by: timedelta) -> None:
        self.store.runs[run_id].scheduled_at += by

    async def finished_ago(self, run_id: str, ago: timedelta) -> None:
        self.store.runs[run_id].finished_at = self.clock.now() - ago

    async def attempts(self, run_id: str) -> list[tuple[int, int, str, str]]:
        return [
            (a.attempt, a.epoch, a.outcome.value, a.worker)
            for a in sorted(self.store.attempts, key=lambda a: (a.attempt, a.epoch))
            if a.run_id == run_id
        ]

    async def gaps(self, job: str) -> list[tuple[datetime, datetime, int, str]]:
        return sorted(
            (g.first, g.last, g.count, g.reason) for name, g in self.store.gaps if name == job
        )

    async def set_paused(self, job: str, paused: bool) -> None:
        await self.store.set_paused(job, paused)

    async def pause_unseen(self, job: str) -> None:
        self.store.jobs[job].paused = True

    async def make_unreadable(self, job: str) -> None:
        row = self.store.jobs[job]
        definition = json.loads(row.definition)
        definition["executor"]["kind"] = "teleport"
        row.definition = json.dumps(definition)

    async def later(self) -> None:
        self.clock.advance(timedelta(seconds=1))

    def unknown_run(self) -> str:
        return str(uuid.uuid4())

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        self.store.outage = StoreUnavailable("the database is away (a test's outage)")
        try:
            yield
        finally:
            self.store.outage = None


ROW = """
SELECT state, attempt, claim_epoch, lease_owner, lease_expires_at, scheduled_at, due_at,
       started_at, finished_at, outcome, error
  FROM job_runs WHERE id = $1::uuid
"""


class PostgresRows:
    def __init__(self, store: PostgresRunStore) -> None:
        self.store = store
        self.pool = store.pool

    async def insert(
        self,
        job: str,
        scheduled: timedelta = timedelta(0),
        due: timedelta | None = None,
        trigger: str = "schedule",
        overlap: Overlap | None = None,
        attempt: int = 1,
    ) -> str:
        run_id: str = await self.pool.fetchval(
            """INSERT INTO job_runs (job_id, scheduled_at, due_at, trigger, overlap, attempt)
               SELECT id, now() + $2::interval, now() + $3::interval, $4, $5, $6 FROM jobs
                WHERE name = $1
               RETURNING id::text""",
            job,
            scheduled,
            scheduled if due is None else due,
            trigger,
            None if overlap is None else overlap.value,
            attempt,
        )
        assert run_id is not None, f"no job {job!r}"
        return run_id

    async def force(
        self,
        run_id: str,
        state: RunState,
        *,
        owner: str = "other",
        lease: timedelta = timedelta(minutes=5),
        finished: timedelta = timedelta(0),
    ) -> None:
        leased = state in (RunState.CLAIMED, RunState.RUNNING)
        await self.pool.execute(
            """UPDATE job_runs
                  SET state = $2, lease_owner = $3, lease_expires_at = now() + $4::interval,
                      finished_at = now() - $5::interval, outcome = $6
                WHERE id = $1::uuid""",
            run_id,
            state.value,
            owner if leased else None,
            lease if leased else None,
            finished if state.terminal else None,
            state.value if state.terminal else None,
        )

    async def row(self, run_id: str) -> Row | None:
        r = await self.pool.fetchrow(ROW, run_id)
        if r is None:
            return None
        return Row(RunState(r["state"]), *list(r.values())[1:])

    async def expire_lease(self, run_id: str) -> None:
        await self.pool.execute(
            "UPDATE job_runs SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = $1::uuid",
            run_id,
        )

    async def move_instant(self, run_id: str, by: timedelta) -> None:
        await self.pool.execute(
            "UPDATE job_runs SET scheduled_at = scheduled_at + $2::interval WHERE id = $1::uuid",
            run_id,
            by,
        )

    async def finished_ago(self, run_id: str, ago: timedelta) -> None:
        await self.pool.execute(
            "UPDATE job_runs SET finished_at = now() - $2::interval WHERE id = $1::uuid",
            run_id,
            ago,
        )

    async def attempts(self, run_id: str) -> list[tuple[int, int, str, str]]:
        rows = await self.pool.fetch(
            "SELECT attempt, claim_epoch, outcome, worker FROM job_run_attempts"
            " WHERE run_id = $1::uuid ORDER BY attempt, claim_epoch",
            run_id,
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    async def gaps(self, job: str) -> list[tuple[datetime, datetime, int, str]]:
        rows = await self.pool.fetch(
            "SELECT g.from_at, g.to_at, g.count, g.reason FROM job_run_gaps g"
            " JOIN jobs j ON j.id = g.job_id WHERE j.name = $1 ORDER BY g.from_at",
            job,
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    async def set_paused(self, job: str, paused: bool) -> None:
        operations = Operations(self.pool)
        await (operations.pause(job) if paused else operations.resume(job))

    async def pause_unseen(self, job: str) -> None:
        await self.pool.execute("UPDATE jobs SET paused = true WHERE name = $1", job)

    async def make_unreadable(self, job: str) -> None:
        await self.pool.execute(
            "UPDATE jobs SET definition = jsonb_set(definition, '{executor,kind}', '\"teleport\"')"
            " WHERE name = $1",
            job,
        )

    async def later(self) -> None:
        return None

    def unknown_run(self) -> str:
        return str(uuid.uuid4())

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[None]:
        # The store's pool swapped for one on a port nothing listens on: its calls
        # fail to connect, as when the database is down.
        away = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/x", min_size=0)
        self.store._pool = away
        try:
            yield
        finally:
            self.store._pool = self.pool
            await away.close()


__all__ = ["MemoryRows", "PostgresRows", "Row", "Rows"]

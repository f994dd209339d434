"""The RunStore port in memory: the SQL's semantics, for fast unit tests of the actors.

Each method mirrors one statement of actors.adapters.postgres (named in its
docstring) on plain Python rows, under the same guards: the claim epoch fences
every change after a claim, a lease is judged on the store's clock (the
injected ``clock``: the database's now() of the real thing), ``(job,
scheduled_at)`` is one row forever, and the attempt verdicts come from
actors.domain.decide_attempt. One event loop, no awaits inside a method: each
call is atomic, as each statement is. It proves an actor's logic, never the
distributed behaviour (the integration tests and the fault harness do that).

Held to the same contract tests as the PostgreSQL store (tests/contract): where
the two disagree, PostgreSQL is right and this store is fixed.

The rooms, each a layer of the class: the tables and what a replica reads
besides (memory_tables), the job catalog (memory_catalog), the claims
(memory_claims), the worker's statements (memory_worker), and here the
reaper's. The rules they judge rows by are actors.domain.row_rules, the SQL's own.
"""

from __future__ import annotations

from datetime import timedelta

from actors.domain import Outcome, RunState, decide_attempt
from actors.domain.row_rules import lease_expired, prunable
from actors.domain.runs import REMOVED_FROM_CONFIG
from actors.ports import Outage
from actors.ports.translator import Fault, Translator, speaks_the_port
from actors.testing.memory_rows import DEADLINE_MISSED, SUPERSEDED
from actors.testing.memory_worker import InMemoryWorkerStatements


def _memory_fault(exc: BaseException) -> Fault | None:
    return Fault.UNREACHABLE if isinstance(exc, Outage) else None


# The in-memory store's outage (``outage``, a port's Outage) is reported as PostgreSQL's
# are: the same translator, the same health calls.
MEMORY = Translator(_memory_fault)


@speaks_the_port(MEMORY)
class InMemoryRunStore(InMemoryWorkerStatements):
    """RunStore on the in-memory rows: claims, starts, heartbeats, completions, the reaper."""

    async def reap_expired_leases(self, limit: int) -> list[tuple[str, str, str]]:
        """LOCK_EXPIRED_LEASES, each verdict from decide_attempt, APPLY_REAPED."""
        now = self._now()
        expired = sorted(
            (r for r in self.runs.values() if lease_expired(r, now)),
            key=lambda r: r.lease_expires_at or now,
        )[:limit]
        reaped = []
        for run in expired:
            before = run.state
            verdict = decide_attempt(
                Outcome.LEASE_EXPIRED,
                state=before,
                attempt=run.attempt,
                max_attempts=self._job_of(run).max_attempts,
                policy=None,
                run_id=run.id,
            )
            if before is RunState.RUNNING:
                error = f"lease expired on {run.lease_owner}"
                self._attempt(run, run.lease_owner or "", Outcome.LEASE_EXPIRED, error)
                run.outcome, run.error = Outcome.LEASE_EXPIRED.value, error
            run.apply(verdict, now)
            run.started_at = None  # APPLY_REAPED clears it whatever the verdict
            reaped.append((run.id, run.job, f"{before}->{verdict.state}"))
        return reaped

    async def cancel_orphaned_runs(self) -> int:
        """CANCEL_ORPHANED_RUNS: pending runs of jobs gone from the config."""
        now = self._now()
        orphaned = [
            r
            for r in self.runs.values()
            if r.state is RunState.PENDING and not self._job_of(r).enabled
        ]
        for run in orphaned:
            run.finish(RunState.CANCELLED, now, REMOVED_FROM_CONFIG)
        return len(orphaned)

    async def prune_history(self, older_than: timedelta, batch: int) -> int:
        """PRUNE_HISTORY: up to ``batch`` terminal runs finished before now - older_than; the
        job's history_pruned_through moves to the latest instant deleted."""
        now = self._now()
        terminal = [
            r for r in self.runs.values() if prunable(r.state, r.finished_at, now, older_than)
        ]
        # ORDER BY finished_at: the oldest history goes first
        old = [r.id for r in sorted(terminal, key=lambda r: r.finished_at or now)][:batch]
        for run_id in old:
            run = self.runs.pop(run_id)
            job = self.jobs[run.job]
            if job.history_pruned_through is None or run.scheduled_at > job.history_pruned_through:
                job.history_pruned_through = run.scheduled_at
        return len(old)


__all__ = ["DEADLINE_MISSED", "SUPERSEDED", "InMemoryRunStore"]

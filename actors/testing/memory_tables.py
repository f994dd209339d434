"""The tables of the in-memory store, their helpers, and what a replica reads besides the
ports (its clock, the cluster's figures, the action log)."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from actors.domain import DecodedJobs, Overlap, RunState, SkipReason, row_rules
from actors.domain.generations import Generation
from actors.domain.history import Gap
from actors.observability import DependencyHealth
from actors.ports import Action, Clock, ClusterReading, JobReading, RejectedJob, StoreUnavailable
from actors.ports.messages import ConfigReplica
from actors.ports.translator import reads_only
from actors.testing.memory_rows import AttemptRow, JobRow, RunRow


@dataclass
class InMemoryTables:
    """The rows every in-memory statement reads and writes, on ``clock``'s time.

    ``outage``: while set, every call raises it (a database that is away).
    """

    clock: Clock
    jobs: dict[str, JobRow] = field(default_factory=dict)
    runs: dict[str, RunRow] = field(default_factory=dict)
    attempts: list[AttemptRow] = field(default_factory=list)
    rejected: dict[str, RejectedJob] = field(default_factory=dict)
    rejected_by: tuple[str, datetime] | None = None  # (replica, recorded_at) of the last load
    # The action log, as operator_actions holds it (actors.ports.ActionRecord's keys).
    actions: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[tuple[str, Gap]] = field(default_factory=list)  # (job, instants dropped)
    generations: list[Generation] = field(default_factory=list)  # config_generations, by seq
    # config_replicas: each replica's report and when it expires.
    config_reports: dict[str, tuple[ConfigReplica, datetime]] = field(default_factory=dict)
    outage: Exception | None = None
    # What its calls report to (as PostgreSQL's store reports to POSTGRES_HEALTH); None:
    # nothing. MemoryPorts hands it the replica's store health.
    health: DependencyHealth | None = None
    closed: bool = False
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _decoded: DecodedJobs = field(default_factory=DecodedJobs)

    # -- helpers -----------------------------------------------------------------------

    def _now(self) -> datetime:
        if self.outage is not None:
            raise self.outage
        if self.closed:
            raise StoreUnavailable("store closed")
        return self.clock.now()

    def _job_of(self, run: RunRow) -> JobRow:
        return self.jobs[run.job]

    def _runs_of(self, job: str) -> list[RunRow]:
        return [r for r in self.runs.values() if r.job == job]

    def _must_not_run(self, run: RunRow, now: datetime) -> SkipReason | None:
        return row_rules.must_not_run(run, self._job_of(run), self._runs_of(run.job), now)

    def _busy(self, job: str) -> bool:
        return row_rules.job_busy(self._runs_of(job))

    def add_run(
        self,
        job: str,
        scheduled_at: datetime,
        *,
        due_at: datetime | None = None,
        trigger: str = "schedule",
        overlap: Overlap | None = None,
    ) -> RunRow:
        """A pending run, as the materializer, a trigger or a backfill writes it."""
        run = RunRow(
            str(uuid.uuid4()),
            job,
            scheduled_at,
            due_at or scheduled_at,
            trigger=trigger,
            overlap=overlap,
        )
        self.runs[run.id] = run
        return run

    def in_state(self, *states: RunState) -> list[RunRow]:
        return sorted(
            (r for r in self.runs.values() if r.state in states), key=lambda r: r.scheduled_at
        )

    # -- what a replica needs beyond the port -----------------------------------------

    async def migrate(self) -> list[str]:
        self._now()
        return []

    async def close(self) -> None:
        self.closed = True

    @reads_only
    async def ping(self) -> None:
        self._now()

    @reads_only
    async def database_now(self) -> datetime:
        return self._now()

    @reads_only
    async def cluster_figures(self, timeout: float) -> ClusterReading:
        """The cluster gauges' reading, simplified: job figures without overdue ages."""
        now = self._now()
        readings = []
        for job in sorted(self.jobs.values(), key=lambda j: j.name):
            if not job.enabled:
                continue
            mine = [r for r in self.runs.values() if r.job == job.name]
            ok = [r.finished_at for r in mine if r.state is RunState.SUCCEEDED and r.finished_at]
            bad = [r.finished_at for r in mine if r.state is RunState.FAILED and r.finished_at]
            overdue = [r for r in mine if r.state is RunState.PENDING and r.due_at <= now]
            readings.append(
                JobReading(
                    name=job.name,
                    paused=job.paused,
                    fingerprint=job.fingerprint,
                    definition=job.definition,
                    last_success=max(ok, default=None),
                    last_failure=max(bad, default=None),
                    overdue=0 if job.paused else len(overdue),
                    overdue_oldest_age=max(
                        ((now - r.due_at).total_seconds() for r in overdue), default=0.0
                    ),
                    materialized_behind=0.0,
                )
            )
        return ClusterReading(
            jobs=tuple(readings),
            claimed=len(self.in_state(RunState.CLAIMED)),
            running=len(self.in_state(RunState.RUNNING)),
            past_lease=sum(row_rules.lease_expired(r, now) for r in self.runs.values()),
        )

    async def record_reload(
        self, replica_id: str, reload: Action, *, by_signal: bool = True
    ) -> None:
        """The operator action a reload leaves (record_action)."""
        actor = "sighup" if by_signal else "config-watch"
        self.record(actor, "signal", replica_id, reload)

    def record(self, actor: str, via: str, origin: str | None, action: Action) -> dict[str, Any]:
        """RECORD_ACTION: one row of the action log, its id the next, at the store's now."""
        row = {
            "id": len(self.actions) + 1,
            "at": self._now(),
            "actor": actor,
            "via": via,
            "origin": origin,
            "action": action.name,
            "job": action.job,
            "run_id": action.run_id,
            "arguments": json.dumps(action.arguments or {}, default=str, ensure_ascii=False),
            "ok": action.ok,
            "result": action.result,
        }
        self.actions.append(row)
        return row

    async def record_rejected_jobs(self, replica_id: str, rejected: Sequence[RejectedJob]) -> None:
        """CLEAR_REJECTED_JOBS, RECORD_REJECTED_JOBS: the last load's set, whole."""
        now = self._now()
        self.rejected = {r.job: r for r in rejected}
        self.rejected_by = (replica_id, now)

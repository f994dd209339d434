"""What an operator can ask: jobs, runs, one run, the audit of a range, the action log."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from actors.config import JOB_NAME_PATTERN
from actors.domain.generations import SHORT, disagreement
from actors.domain.history import (
    RangeTooLarge,
    audit_instants,
    audit_range,
    zone_name,
    zone_of,
)
from actors.operator.errors import NotFound, Unprocessable
from actors.operator.grid import grid_of
from actors.operator.models import (
    Attempt,
    Audit,
    ConfigGeneration,
    ConfigReplica,
    ConfigRollout,
    Job,
    JobDetail,
    RejectedJob,
    RunDetail,
    RunsPage,
)
from actors.operator.shapes import (
    audit_of,
    check_limit,
    check_states,
    decode_cursor,
    encode_cursor,
    iso,
    job_of,
    local,
    parse_time,
    run_id_of,
    run_of,
    schedule_of,
    utc,
    zone_named,
)
from actors.ports import AttemptRecord, JobRecord, OperatorStore, RunFilter, RunRow

GENERATIONS_LISTED = 10


class OperatorReads:
    """Reads over the operator's port, as the CLI and the API offer them."""

    def __init__(self, store: OperatorStore) -> None:
        self.history = store

    # --- reads --------------------------------------------------------------------

    async def _job_row(self, name: str) -> JobRecord:
        if not re.fullmatch(JOB_NAME_PATTERN, name):  # never a job: not worth a query
            raise NotFound(f"no job named {name!r}")
        row = await self.history.job(name)
        if row is None:
            raise NotFound(f"no job named {name!r}")
        return row

    async def config_rollout(self) -> ConfigRollout:
        """The config generations and the replicas' files (docs/rollout.md).

        ``in_force``: the generation every replica runs (the stored definitions);
        ``replicas``: each replica reporting now, its file's digest and whether
        that file was refused as older than the generation in force;
        ``disagreement``: "replicas disagree: 2 on digest A, 1 on digest B", or
        None when every replica reports one file.
        """
        rollout = await self.history.config_rollout(GENERATIONS_LISTED)
        generations = [
            ConfigGeneration(
                generation=g.seq,
                digest=g.short,
                config_version=g.version,
                since=utc(g.first_seen_at),
                replica=g.replica,
                forced=g.forced,
            )
            for g in rollout.generations
        ]
        in_force = rollout.generations[0].digest if rollout.generations else None
        digests = rollout.file_digests()
        return ConfigRollout(
            in_force=generations[0] if generations else None,
            generations=generations,
            replicas=[
                ConfigReplica(
                    replica=r.replica,
                    digest=r.file_digest[:SHORT],
                    config_version=r.config_version,
                    in_force=r.file_digest == in_force,
                    stale=r.stale,
                    path=r.path,
                    seen_at=utc(r.seen_at),
                )
                for r in rollout.replicas
            ],
            digests={d[:SHORT]: n for d, n in sorted(digests.items())},
            disagreement=disagreement(digests),
        )

    async def rejected_jobs(self) -> list[RejectedJob]:
        """The jobs the config file rejected at its last load, with the loader's error.

        ``old_definition_running``: the job is in the catalog, so the definition
        it had before the rejected edit keeps running; otherwise it never runs
        until the file is fixed and reloaded.
        """
        return [RejectedJob.from_row(r) for r in await self.history.rejected_jobs()]

    async def jobs(self, name: str | None = None) -> list[Job]:
        """Every job (or one): its state, schedule, next fire, backlog, last outcome and
        last success, and the config file's rejected edit of it (its old definition keeps
        running), if any."""
        now = await self.history.now()
        rejected = {r.job: r for r in await self.rejected_jobs()}
        return [
            job_of(row, now, rejected.get(row["name"])) for row in await self.history.jobs(name)
        ]

    async def job(self, name: str, recent: int = 20) -> JobDetail:
        """One job's overview and its most recent runs."""
        found = await self.jobs(name)
        if not found:
            raise NotFound(f"no job named {name!r}")
        runs = (await self.runs(job=name, limit=recent)).runs if recent else []
        return JobDetail(**dict(found[0]), recent_runs=runs)

    async def runs(
        self,
        *,
        job: str | None = None,
        states: Sequence[str] | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        ahead: bool = False,
    ) -> RunsPage:
        """Runs newest first; ``next_cursor`` continues the listing.

        What has happened: runs scheduled at or before now, unless ``ahead``
        asks for the materializer's look-ahead rows too.
        """
        wanted = check_states(states)
        limit = check_limit(limit)
        before = decode_cursor(cursor) if cursor else None
        job_id = None
        zone: tzinfo = UTC
        now = await self.history.now()
        if job is not None:
            row = await self._job_row(job)
            job_id, zone = row["id"], zone_named(row["timezone"])
        start = parse_time(since, zone, now, "since") if since else None
        end = parse_time(until, zone, now, "until") if until else None
        if start and end and end < start:
            raise Unprocessable(f"until ({iso(end)}) is before since ({iso(start)})")
        rows = await self.history.runs(
            RunFilter(
                job_id=job_id,
                states=wanted,
                since=start,
                until=end,
                before=before,
                limit=limit + 1,
                ahead=ahead,
            )
        )
        more = len(rows) > limit
        rows = rows[:limit]
        return RunsPage(
            runs=[run_of(r) for r in rows],
            next_cursor=encode_cursor(rows[-1]) if more else None,
        )

    async def run(self, run_id: str) -> RunDetail:
        """One run with every attempt's verdict, its error, output tail, lease and epoch."""
        found = await self.history.run(run_id_of(run_id))
        if found is None:
            raise NotFound(f"no run {run_id}")
        row, attempts = found
        now = row["now"]
        return RunDetail.from_row(
            row,
            scheduled_local=local(row["scheduled_at"], zone_named(row["timezone"])),
            lease_expired=row["lease_expires_at"] is not None and row["lease_expires_at"] < now,
            attempts=[
                Attempt.from_row(
                    a,
                    # The running attempt: how long it has run so far.
                    duration_s=_seconds(
                        a["started_at"],
                        a["finished_at"] or (now if a["outcome"] == "running" else None),
                    ),
                )
                for a in [*attempts, *unrecorded_attempt(row, attempts)]
            ],
        )

    async def audit(self, job: str, start: str, end: str) -> Audit:
        """Each due instant of ``job`` in the range with its row, or why it has none."""
        row = await self._job_row(job)
        schedule = schedule_of(row["definition"])
        zone = zone_of(schedule)
        now = row["now"]
        first, last = parse_time(start, zone, now, "from"), parse_time(end, zone, now, "to")
        try:
            # The range is checked before any history is read: a range of a million
            # instants is refused at once, without reading its rows.
            audit_instants(schedule, first, last)
            result = audit_range(
                schedule,
                first,
                last,
                now,
                row["due_since"],
                *await self.history.audit_records(row["id"], first, last, 200_000),
                paused=await self.history.paused_spans(job),
                pruned_through=row["history_pruned_through"],
            )
        except RangeTooLarge as exc:
            raise Unprocessable(str(exc)) from None
        except ValueError as exc:
            raise Unprocessable(str(exc)) from None
        return audit_of(job, zone_name(schedule), zone, now, result)

    async def grid(self, instants: int = 30, job: str | None = None) -> dict[str, Any]:
        """Each job's last ``instants`` due instants, judged as ``audit`` judges them."""
        return await grid_of(self.history, instants, job)

    async def actions(
        self, *, job: str | None = None, limit: int = 50, before: int | None = None
    ) -> list[dict[str, Any]]:
        """Operator actions, newest first: who, when, what, with what, and the result."""
        limit = check_limit(limit)
        if job is not None and not re.fullmatch(JOB_NAME_PATTERN, job):
            return []  # no job has such a name, so no action names it
        rows = await self.history.actions(job=job, before=before, limit=limit)
        return [{**r, "at": iso(r["at"]), "arguments": json.loads(r["arguments"])} for r in rows]


def unrecorded_attempt(row: RunRow, recorded: Sequence[AttemptRecord]) -> list[AttemptRecord]:
    """The run's current attempt when ``job_run_attempts`` has no verdict of it (yet).

    A verdict is written when an attempt finishes: the one running now has none,
    and neither has one cancelled while it ran (the cancel ends the run, not the
    attempt). Its claim epoch tells it apart from the attempts recorded.
    """
    if row["started_at"] is None or any(a["claim_epoch"] == row["claim_epoch"] for a in recorded):
        return []
    if row["state"] == "running":
        outcome, finished = "running", None
    elif row["state"] == "cancelled":
        outcome, finished = "cancelled", row["finished_at"]
    else:
        return []
    return [
        {
            "attempt": row["attempt"],
            "claim_epoch": row["claim_epoch"],
            "worker": row["lease_owner"],
            "started_at": row["started_at"],
            "finished_at": finished,
            "outcome": outcome,
            "exit_code": None,
            "error": row["error"] if outcome == "cancelled" else None,
            "output_tail": None,
        }
    ]


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()

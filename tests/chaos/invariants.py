"""The promises, checked with SQL after the storm.

1. Every instant the schedules say was due in the window has exactly one
   ``job_runs`` row (no gaps, no doubles).
2. Every such row is terminal.
3. No run is recorded succeeded twice; its attempts are consistent.
4. Effects per idempotency key: keys executed more than once (duplicate
   executions, counted) and succeeded runs with no effect (lost work).
5. Fencing: the recorded success of a run is the work of the attempt that
   owned the run's latest claim, never a zombie's late completion.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from actors.domain import TERMINAL_STATES, Job

WINDOW_RUNS = """
SELECT r.id::text AS id, j.name AS job, r.scheduled_at, r.state, r.claim_epoch, r.attempt,
       r.finished_at, r.outcome
  FROM job_runs r JOIN jobs j ON j.id = r.job_id
 WHERE r.scheduled_at > $1 AND r.scheduled_at <= $2 AND j.name = ANY($3::text[])
"""
WINDOW_ATTEMPTS = """
SELECT a.run_id::text AS run_id, a.attempt, a.claim_epoch, a.worker, a.outcome
  FROM job_run_attempts a JOIN job_runs r ON r.id = a.run_id
 WHERE r.scheduled_at > $1 AND r.scheduled_at <= $2
"""
WINDOW_EFFECTS = """
SELECT run_id::text AS run_id, attempt, fencing_token, pid, began_at, recorded_at
  FROM chaos_effects
 WHERE scheduled_at > $1 AND scheduled_at <= $2
"""
TERMINAL = {s.value for s in TERMINAL_STATES}
# A run is "late" when the execution that was recorded began this long after
# its instant; recovery is measured until the last late run finished.
LATE_AFTER = timedelta(seconds=2)
EXAMPLES = 5


@dataclass
class RunRow:
    id: str
    job: str
    scheduled_at: datetime
    state: str
    epoch: int
    attempt: int
    finished_at: datetime | None
    outcome: str | None
    attempts: list[asyncpg.Record] = field(default_factory=list)
    effects: list[asyncpg.Record] = field(default_factory=list)

    def recorded_effect(self) -> asyncpg.Record | None:
        """The effect of the execution whose success was recorded, if any."""
        won = [a for a in self.attempts if a["outcome"] == "succeeded"]
        if len(won) != 1:
            return None
        pid = worker_pid(won[0]["worker"])
        for effect in self.effects:
            if effect["fencing_token"] == won[0]["claim_epoch"] and effect["pid"] == pid:
                return effect
        return None


def worker_pid(worker: str | None) -> int | None:
    """A replica id is ``host:pid:suffix`` (actors.replica.Replica.replica_id)."""
    if not worker:
        return None
    parts = worker.split(":")
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


@dataclass
class Report:
    """What the invariants found in the window."""

    window_start: datetime
    window_end: datetime
    due: int = 0
    recorded: int = 0
    states: Counter[str] = field(default_factory=Counter)
    missing: int = 0  # (1) an instant with no row
    unexpected: int = 0  # (1) a row at an instant the schedule does not name
    doubled_rows: int = 0  # (1) an instant with more than one row
    non_terminal: int = 0  # (2)
    succeeded_twice: int = 0  # (3)
    inconsistent: int = 0  # (3)
    lost_work: int = 0  # (4) succeeded with no effect
    duplicate_keys: int = 0  # (4) keys executed more than once
    extra_executions: int = 0  # (4) executions beyond the first, summed over keys
    duplicates_new_claim: int = 0  # keys re-executed under a newer claim epoch
    duplicates_same_claim: int = 0  # keys executed twice under one claim epoch
    failed_work: int = 0  # failed runs (terminal, accounted for) for the table
    fencing_violations: int = 0  # (5)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    runs: list[RunRow] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.missing + self.non_terminal + self.lost_work

    @property
    def doubled(self) -> int:
        return self.doubled_rows + self.succeeded_twice

    def failures(self) -> list[str]:
        """The invariants that do not hold, in words."""
        out = []
        if self.missing:
            out.append(f"(1) {self.missing} due instants have no run row")
        if self.doubled_rows:
            out.append(f"(1) {self.doubled_rows} instants have more than one run row")
        if self.unexpected:
            out.append(f"(1) {self.unexpected} rows at instants no schedule names")
        if self.non_terminal:
            out.append(f"(2) {self.non_terminal} runs in the window are not terminal")
        if self.succeeded_twice:
            out.append(f"(3) {self.succeeded_twice} runs recorded succeeded twice")
        if self.inconsistent:
            out.append(f"(3) {self.inconsistent} runs with attempts inconsistent with their row")
        if self.lost_work:
            out.append(f"(4) {self.lost_work} runs recorded succeeded with no effect (lost work)")
        if self.fencing_violations:
            out.append(
                f"(5) {self.fencing_violations} runs whose recorded success is not the "
                "work of their latest claim (a zombie overwrote a newer attempt)"
            )
        return out

    def note(self, kind: str, text: str) -> None:
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(text)


async def load_runs(
    conn: asyncpg.Connection | asyncpg.Pool, start: datetime, end: datetime, jobs: Sequence[str]
) -> list[RunRow]:
    rows = await conn.fetch(WINDOW_RUNS, start, end, list(jobs))
    runs = {
        r["id"]: RunRow(
            r["id"],
            r["job"],
            r["scheduled_at"],
            r["state"],
            r["claim_epoch"],
            r["attempt"],
            r["finished_at"],
            r["outcome"],
        )
        for r in rows
    }
    for a in await conn.fetch(WINDOW_ATTEMPTS, start, end):
        if a["run_id"] in runs:
            runs[a["run_id"]].attempts.append(a)
    for e in await conn.fetch(WINDOW_EFFECTS, start, end):
        if e["run_id"] in runs:
            runs[e["run_id"]].effects.append(e)
    return list(runs.values())


async def check_invariants(
    conn: asyncpg.Connection | asyncpg.Pool, jobs: Mapping[str, Job], start: datetime, end: datetime
) -> Report:
    """Check the five invariants over the instants in ``(start, end]``."""
    report = Report(start, end)
    runs = await load_runs(conn, start, end, sorted(jobs))
    report.runs = runs
    by_instant: dict[tuple[str, datetime], list[RunRow]] = defaultdict(list)
    for run in runs:
        by_instant[(run.job, run.scheduled_at)].append(run)
    expected: set[tuple[str, datetime]] = set()
    for name, job in jobs.items():
        expected.update((name, t) for t in job.schedule.fire_times(start, end))
    report.due = len(expected)
    for key in sorted(expected):
        rows = by_instant.get(key, [])
        if not rows:
            report.missing += 1
            report.note("missing", f"{key[0]} @ {key[1].isoformat()}")
            continue
        report.recorded += 1
        if len(rows) > 1:
            report.doubled_rows += 1
            report.note("doubled", f"{key[0]} @ {key[1].isoformat()}: {len(rows)} rows")
    for key in sorted(set(by_instant) - expected):
        report.unexpected += 1
        report.note("unexpected", f"{key[0]} @ {key[1].isoformat()}")
    for run in runs:
        if (run.job, run.scheduled_at) in expected:
            _check_run(report, run)
    return report


def _check_run(report: Report, run: RunRow) -> None:
    report.states[run.state] += 1
    if run.state not in TERMINAL:
        report.non_terminal += 1
        report.note(
            "non_terminal",
            f"{run.id} {run.job} @ {run.scheduled_at.isoformat()} "
            f"is {run.state} (epoch {run.epoch})",
        )
    if run.state == "failed":
        report.failed_work += 1
        report.note("failed", f"{run.id} {run.job} attempt {run.attempt}: {run.outcome}")
    won = [a for a in run.attempts if a["outcome"] == "succeeded"]
    if len(won) > 1:
        report.succeeded_twice += 1
        report.note("succeeded_twice", f"{run.id}: {len(won)} succeeded attempts")
    problem = _attempt_problem(run, won)
    if problem:
        report.inconsistent += 1
        report.note("inconsistent", f"{run.id}: {problem}")
    # (4) effects per idempotency key
    if len(run.effects) > 1:
        report.duplicate_keys += 1
        report.extra_executions += len(run.effects) - 1
        tokens = Counter(e["fencing_token"] for e in run.effects)
        if any(n > 1 for n in tokens.values()):
            report.duplicates_same_claim += 1
            report.note("same_claim", f"{run.id}: tokens {dict(tokens)}")
        else:
            report.duplicates_new_claim += 1
    if run.state == "succeeded" and not run.effects:
        report.lost_work += 1
        report.note("lost_work", f"{run.id} {run.job} succeeded with no effect")
    # (5) fencing: the success on record is the work of the latest claim
    if run.state == "succeeded" and len(won) == 1:
        if won[0]["claim_epoch"] != run.epoch:
            report.fencing_violations += 1
            report.note(
                "fencing",
                f"{run.id}: row epoch {run.epoch}, succeeded attempt epoch {won[0]['claim_epoch']}",
            )
        elif run.recorded_effect() is None:
            report.fencing_violations += 1
            effects = sorted((e["fencing_token"], e["pid"]) for e in run.effects)
            report.note(
                "fencing",
                f"{run.id}: success recorded for epoch {run.epoch} by "
                f"{won[0]['worker']}, but that process did not execute "
                f"epoch {run.epoch}; executions (epoch, pid): {effects}",
            )


def _attempt_problem(run: RunRow, won: list[Any]) -> str | None:
    # An attempt interrupted by a clean shutdown hands the run back without
    # using up its number; the next attempt carries the same one.
    numbers = [a["attempt"] for a in run.attempts if a["outcome"] != "interrupted"]
    if len(set(numbers)) != len(numbers):
        return f"attempt numbers repeat: {sorted(numbers)}"
    if any(a["claim_epoch"] > run.epoch for a in run.attempts):
        return "an attempt has an epoch newer than the run's"
    if run.state == "succeeded":
        if len(won) != 1:
            return f"state succeeded with {len(won)} succeeded attempts"
        if run.outcome != "succeeded":
            return f"state succeeded but outcome {run.outcome}"
        if won[0]["attempt"] != max(numbers):
            return "the succeeded attempt is not the last one"
    elif won:
        return f"state {run.state} but an attempt succeeded"
    if run.state in ("succeeded", "failed") and numbers and max(numbers) != run.attempt:
        return f"row attempt {run.attempt}, last attempt row {max(numbers)}"
    if run.state == "failed" and not numbers:
        return "failed without any attempt row"
    return None


# --- recovery -------------------------------------------------------------------------


def began_late(run: RunRow) -> datetime | None:
    """When the execution on record began, if that was more than LATE_AFTER late.

    A failed run counts by its end: that is when it was settled.
    """
    effect = run.recorded_effect()
    began: datetime | None = effect["began_at"] if effect is not None else run.finished_at
    if began is None or began - run.scheduled_at <= LATE_AFTER:
        return None
    return began


def recovery_seconds(
    runs: Sequence[RunRow], faults: Sequence[datetime], work: Mapping[str, timedelta]
) -> list[float]:
    """Per fault (by start time): seconds until the last run it delayed began again.

    A late run is charged to the last fault that began before the run was due
    to finish (its instant plus the job's normal ``work`` time): the fault that
    found it waiting or executing. A fault that delayed no run recovers in 0 s.
    """
    order = sorted(range(len(faults)), key=lambda i: faults[i])
    last: list[datetime | None] = [None] * len(faults)
    for run in runs:
        began = began_late(run)
        if began is None:
            continue
        due_done = run.scheduled_at + work.get(run.job, timedelta(seconds=0.5))
        culprit = None
        for i in order:
            if faults[i] <= due_done and faults[i] < began:
                culprit = i
        if culprit is None:
            continue
        current = last[culprit]
        if current is None or began > current:
            last[culprit] = began
    return [
        0.0 if end is None else max(0.0, (end - start).total_seconds())
        for end, start in zip(last, faults, strict=True)
    ]

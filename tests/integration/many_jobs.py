"""A generated deployment of 1,000 jobs with a known health, for the status page at scale.

Every job is a daily cron whose hour is at least an hour away, so none fires
while a test runs and the health written here stays what it is: six days of
past runs per job, of which some jobs' last run failed, some have a run due
and never started (claimed by a replica that went away, its lease far ahead),
some are paused (through the API, as an operator would) and one has an edit
the config file rejected; two new jobs are rejected outright.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from actors.adapters.postgres import PostgresRunStore
from actors.domain import CronSchedule, take

COUNT = 1000
KINDS = ["billing", "export", "report", "sync", "cleanup"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"]
# The job whose edit the config file rejects (its old definition keeps running),
# and the new jobs it rejects outright.
EDITED = 1
REJECTED_NEW = ["zz-bad-cron", "zz-bad-zone"]
DAYS = 6


def name_of(i: int) -> str:
    return f"{KINDS[i % len(KINDS)]}-{i:04d}"


def is_failing(i: int) -> bool:
    return i % 40 == 3


def is_overdue(i: int) -> bool:
    return i % 50 == 7


def is_paused(i: int) -> bool:
    return i % 100 == 11


@dataclass
class Fleet:
    """The generated jobs, their schedules and the health each one was given."""

    now: datetime
    schedules: dict[str, CronSchedule] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.schedules)

    def expected(self) -> dict[str, int]:
        """The summary line's counts: one state per job."""
        failing = sum(is_failing(i) for i in range(COUNT))
        overdue = sum(is_overdue(i) for i in range(COUNT))
        paused = sum(is_paused(i) for i in range(COUNT))
        rejected = 1 + len(REJECTED_NEW)
        healthy = COUNT - failing - overdue - paused - 1
        return {
            "healthy": healthy,
            "failing": failing,
            "overdue": overdue,
            "paused": paused,
            "rejected": rejected,
        }

    def failing_names(self) -> list[str]:
        return sorted(name_of(i) for i in range(COUNT) if is_failing(i))


def fleet(now: datetime) -> Fleet:
    """1,000 daily jobs in four zones, none due within the next hour of ``now``."""
    out = Fleet(now)
    for i in range(COUNT):
        zone = ZONES[i % len(ZONES)]
        hour = (now.astimezone(ZoneInfo(zone)).hour + 2 + i % 20) % 24
        out.schedules[name_of(i)] = CronSchedule(f"{(i * 7) % 60} {hour} * * *", zone)
    return out


def config_toml(jobs: Fleet, *, broken: bool) -> str:
    """The config file; ``broken``: with the rejected edit and the two rejected new jobs."""
    parts = []
    for i, (name, schedule) in enumerate(jobs.schedules.items()):
        cron = "0 25 * * *" if broken and i == EDITED else schedule.expression
        parts.append(
            f'[jobs.{name}]\ncron = "{cron}"\ntimezone = "{schedule.timezone}"\n'
            'run = { python = "actors.config.examples:hello" }\n'
        )
    if broken:
        parts.append('[jobs.zz-bad-cron]\ncron = "61 * * * *"\nrun = { shell = ["true"] }\n')
        parts.append(
            '[jobs.zz-bad-zone]\ncron = "0 1 * * *"\ntimezone = "Mars/Olympus"\n'
            'run = { shell = ["true"] }\n'
        )
    return "\n".join(parts)


async def write_history(store: PostgresRunStore, jobs: Fleet) -> None:
    """Six days of runs per job, as the workers would have left them, in one statement.

    The jobs are moved back to have existed for those six days (so each past
    instant is due, as `claimd audit` judges it). A failing job's last run
    failed; an overdue job's last instant was claimed by a replica that went
    away (its lease far ahead, so no reaper takes it back during the test).
    """
    job_ids = dict(await store.pool.fetch("SELECT name, id FROM jobs"))
    rows: list[tuple[int, datetime, str, str | None, str | None]] = []
    for i, (name, schedule) in enumerate(jobs.schedules.items()):
        instants = take(schedule.fire_times(jobs.now - timedelta(days=DAYS), jobs.now), DAYS + 1)
        for k, at in enumerate(instants):
            last = k == len(instants) - 1
            if last and is_failing(i):
                rows.append((job_ids[name], at, "failed", "exit status 1", "schedule"))
            elif last and is_overdue(i):
                rows.append((job_ids[name], at, "claimed", None, "schedule"))
            else:
                rows.append((job_ids[name], at, "succeeded", None, "schedule"))
        if i == 0:  # a manual run between two instants, and one at an instant
            rows.append((job_ids[name], jobs.now - timedelta(hours=3), "succeeded", None, "manual"))
    await store.pool.execute(
        "UPDATE jobs SET created_at = $1 WHERE name = ANY ($2::text[])",
        jobs.now - timedelta(days=DAYS),
        jobs.names,
    )
    await store.pool.execute(
        """INSERT INTO job_runs (job_id, scheduled_at, due_at, state, trigger, error, outcome,
                                 started_at, finished_at, lease_owner, lease_expires_at,
                                 claimed_at, claim_epoch)
           SELECT u.job_id, u.at, u.at, u.state, u.trigger, u.error,
                  CASE WHEN u.state IN ('succeeded', 'failed') THEN u.state END,
                  CASE WHEN u.state IN ('succeeded', 'failed') THEN u.at + interval '1 s' END,
                  CASE WHEN u.state IN ('succeeded', 'failed') THEN u.at + interval '4 s' END,
                  CASE WHEN u.state = 'claimed' THEN 'gone-replica' END,
                  CASE WHEN u.state = 'claimed' THEN now() + interval '1 hour' END,
                  CASE WHEN u.state = 'claimed' THEN u.at END,
                  CASE WHEN u.state = 'claimed' THEN 1 ELSE 0 END
             FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::text[])
                  AS u(job_id, at, state, error, trigger)
           ON CONFLICT (job_id, scheduled_at) DO NOTHING""",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
    )

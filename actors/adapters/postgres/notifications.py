"""The notification outbox on PostgreSQL (statements in ``statements/notify.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

import asyncpg

from actors.adapters.postgres.errors import POSTGRES, reads_only
from actors.adapters.postgres.statements.notify import (
    CLAIM_NOTIFICATIONS,
    COUNT_DEAD,
    DELETE_VERDICTS,
    ENSURE_STREAKS,
    INSERT_OWED,
    LIST_NOTIFICATIONS,
    LOCK_STREAKS,
    LOCK_VERDICTS,
    OUTBOX_FIGURES,
    POLICIES_OF,
    RECORD_ATTEMPT,
    RECOVER_EXPIRED,
    SCAN_MISSED,
    SCAN_TOO_LONG,
    SYNC_POLICIES,
    TRY_JUDGE_LOCK,
    UPDATE_STREAKS,
)
from actors.domain.notify import (
    Notification,
    NotifyEvent,
    NotifyPolicy,
    Streak,
    judge_verdict,
)
from actors.ports.notify import NotificationRecord, OutboxFigures, SendResult
from actors.ports.translator import speaks_the_port

# What is kept of a sink's answer or error (a 500 page is not kept whole).
REPLY_CHARS = 500


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _cut(text: str | None) -> str | None:
    return None if text is None else text[:REPLY_CHARS]


def _policy(row: asyncpg.Record) -> NotifyPolicy:
    return NotifyPolicy(
        job=row["job_name"],
        sinks=tuple(row["sinks"]),
        events=tuple(NotifyEvent(e) for e in row["events"]),
        failure_tolerance=row["failure_tolerance"],
        realert=row["realert"],
        deadline=row["deadline"],
        too_long=row["too_long"],
    )


@speaks_the_port(POSTGRES)
class PostgresNotificationStore:
    """NotificationStore on the replica's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def sync_policies(self, policies: Sequence[NotifyPolicy]) -> None:
        await self._pool.execute(
            SYNC_POLICIES,
            [p.job for p in policies],
            [",".join(p.sinks) for p in policies],
            [",".join(e.value for e in p.events) for p in policies],
            [p.failure_tolerance for p in policies],
            [_seconds(p.realert) for p in policies],
            [_seconds(p.deadline) for p in policies],
            [_seconds(p.too_long) for p in policies],
        )

    async def judge_verdicts(self, limit: int) -> int:
        """The verdicts the trigger noted, judged in order (actors.domain.notify.judge_verdict)
        into outbox rows, in one transaction; how many were judged."""
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(TRY_JUDGE_LOCK):
                return 0  # another replica is judging
            noted = await conn.fetch(LOCK_VERDICTS, limit)
            if not noted:
                return 0
            names = sorted({r["job_name"] for r in noted})
            await conn.execute(ENSURE_STREAKS, names)
            streaks = {
                r["job_name"]: Streak(r["consecutive_failures"], r["alerted"], r["last_alert_at"])
                for r in await conn.fetch(LOCK_STREAKS, names)
            }
            rows = await conn.fetch(POLICIES_OF, names)
            policies = {r["job_name"]: _policy(r) for r in rows}
            now = rows[0]["now"] if rows else None
            owed: list[tuple[str, str, str, str]] = []
            for verdict in noted:  # in the order they were noted
                name = verdict["job_name"]
                policy = policies.get(name)
                if policy is None or now is None:
                    continue  # the job's policy was removed since
                streaks[name], event = judge_verdict(
                    policy, streaks[name], verdict["state"] == "failed", now
                )
                if event is not None:
                    owed.extend((verdict["run_id"], name, event.value, s) for s in policy.sinks)
            if owed:
                await conn.execute(
                    INSERT_OWED, *(list(column) for column in zip(*owed, strict=True))
                )
            await conn.execute(
                UPDATE_STREAKS,
                names,
                [streaks[n].consecutive_failures for n in names],
                [streaks[n].alerted for n in names],
                [streaks[n].last_alert_at for n in names],
            )
            await conn.execute(DELETE_VERDICTS, [r["id"] for r in noted])
            return len(noted)

    async def scan_missed(self, lookback: timedelta) -> int:
        return int(await self._pool.fetchval(SCAN_MISSED, lookback.total_seconds()))

    async def scan_too_long(self) -> int:
        return len(await self._pool.fetch(SCAN_TOO_LONG))

    async def recover_expired(self, max_attempts: int) -> int:
        return int(await self._pool.fetchval(RECOVER_EXPIRED, max_attempts))

    async def claim(self, sender: str, limit: int, lease: timedelta) -> list[Notification]:
        rows = await self._pool.fetch(CLAIM_NOTIFICATIONS, sender, limit, lease.total_seconds())
        return [
            Notification(
                id=r["id"],
                run_id=r["run_id"],
                job=r["job_name"],
                event=NotifyEvent(r["event"]),
                sink=r["sink"],
                attempt=r["attempts"],
                claim_epoch=r["claim_epoch"],
                scheduled_at=r["scheduled_at"],
                run_state=r["run_state"],
                run_attempt=r["run_attempt"],
                outcome=r["outcome"],
                error=r["error"],
                exit_code=r["exit_code"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
            )
            for r in rows
        ]

    async def record(
        self,
        sender: str,
        notification: Notification,
        result: SendResult,
        retry_in: timedelta,
        max_attempts: int,
    ) -> str | None:
        state: str | None = await self._pool.fetchval(
            RECORD_ATTEMPT,
            notification.id,
            notification.claim_epoch,
            sender,
            result.delivered,
            result.status,
            _cut(result.reply),
            _cut(result.error),
            retry_in.total_seconds(),
            max_attempts,
        )
        return state

    @reads_only
    async def figures(self) -> OutboxFigures:
        row = await self._pool.fetchrow(OUTBOX_FIGURES)
        dead = await self._pool.fetchval(COUNT_DEAD)
        assert row is not None
        return OutboxFigures(pending=row["pending"], oldest_s=row["oldest_s"], dead=dead)

    @reads_only
    async def list(self, job: str | None, limit: int) -> list[NotificationRecord]:
        rows = await self._pool.fetch(LIST_NOTIFICATIONS, job, limit)
        return [
            NotificationRecord(
                id=r["id"],
                created_at=r["created_at"],
                job=r["job_name"],
                run_id=r["run_id"],
                event=r["event"],
                sink=r["sink"],
                state=r["state"],
                attempts=r["attempts"],
                sent_at=r["sent_at"],
                due_at=r["due_at"],
                last_error=r["last_error"],
                attempt_log=tuple(json.loads(r["attempts_json"])),
            )
            for r in rows
        ]

"""`claimd notifications`: what was sent (or is being sent), to which sink, and every attempt.

Reads the outbox in PostgreSQL (the database the operator's commands find:
``--database-url``, ``CLAIMD_DATABASE_URL``, ``--config``, a running `claimd dev`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from datetime import datetime
from typing import Any

from actors.adapters.postgres.notifications import PostgresNotificationStore
from actors.adapters.postgres.pool import connect_pool
from actors.cli.operator.connect import database_url
from actors.cli.operator.options import data_dir_option, database_options
from actors.domain import DEFAULT_TIMEOUTS
from actors.operator import OperatorError
from actors.ports.notify import NotificationRecord


def register(sub: Any) -> None:
    """Add `claimd notifications` to the parser."""
    p = sub.add_parser(
        "notifications",
        help="notifications, newest first: run, event, sink, state and every attempt's answer",
    )
    p.add_argument("job", nargs="?", help="only this job's notifications")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="JSON for scripts")
    database_options(p)
    data_dir_option(p)
    p.set_defaults(func=cmd_notifications)


async def _read(url: str, job: str | None, limit: int) -> list[NotificationRecord]:
    pool = await connect_pool(url, DEFAULT_TIMEOUTS, min_size=1, max_size=1)
    try:
        return await PostgresNotificationStore(pool).list(job, limit)
    finally:
        await pool.close()


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def render(records: list[NotificationRecord]) -> str:
    """A line per notification, then a line per attempt beneath it."""
    if not records:
        return "no notifications"
    lines = [f"{'CREATED (UTC)':<19}  {'JOB':<20} {'EVENT':<9} {'SINK':<10} {'STATE':<7} RUN"]
    for r in records:
        lines.append(
            f"{_when(r.created_at):<19}  {r.job:<20} {r.event:<9} {r.sink:<10} {r.state:<7} "
            f"{r.run_id}"
        )
        for a in r.attempt_log:
            answer = a.get("status") if a.get("status") is not None else "-"
            error = f"  {a['error']}" if a.get("error") else ""
            at = str(a.get("started_at", ""))[:19].replace("T", " ")
            lines.append(
                f"    attempt {a['attempt']}: {a['outcome']:<9} {answer!s:<4} {at}  "
                f"by {a['sender']}{error}"
            )
    return "\n".join(lines)


def cmd_notifications(args: argparse.Namespace) -> int:
    try:
        url = database_url(args)
        if url is None:
            raise OperatorError("no database: give --config or --database-url")
        records = asyncio.run(_read(url, args.job, args.limit))
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([asdict(r) for r in records], default=str, indent=2))
    else:
        print(render(records))
    return 0

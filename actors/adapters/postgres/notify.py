"""LISTEN for runs becoming pending, so the claimer wakes without waiting for its poll.

A trigger (sql/0008_pending_notify.sql) notifies ``claimd_runs_pending`` with
the schema and the soonest due instant of the rows a statement made pending.
One pooled connection is held for the LISTEN; when it is lost the listener
connects again with backoff and, once listening again, reports "something may
be due now" (notifications sent meanwhile were missed). The claimer's poll
(``claim_interval``) stays the safety net: a lost notification costs at most
one interval, as before the listener existed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg

from actors.adapters.postgres.errors import is_outage
from actors.adapters.postgres.statements import PENDING_CHANNEL
from actors.observability import get_logger
from actors.pacing import Backoff, wait_for_stop

log = get_logger("postgres")

# The instant reported when the listener (re)connects, or for a payload it
# cannot read: anything may be due. (Not datetime.min: callers subtract from it.)
_NOW = datetime(1970, 1, 1, tzinfo=UTC)


def parse_pending(payload: str, schema: str) -> datetime | None:
    """The soonest due instant a notification of ``schema`` carries, or None (not ours)."""
    theirs, _, seconds = payload.rpartition(" ")
    if theirs != schema:
        return None
    try:
        return datetime.fromtimestamp(float(seconds), UTC)
    except (ValueError, OverflowError):
        return _NOW


class PendingRunsListener:
    """Calls ``on_pending(due_at)`` for each notification of this schema."""

    def __init__(self, pool: asyncpg.Pool, on_pending: Callable[[datetime], None]) -> None:
        self.pool = pool
        self.on_pending = on_pending

    async def run(self, stop: asyncio.Event) -> None:
        """Listen until ``stop``; a lost connection is waited out and listened on again."""
        backoff = Backoff(initial=0.5, maximum=5.0)
        while not stop.is_set():
            try:
                await self._listen(stop)
                backoff.reset()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                delay = backoff.next_delay()
                log.warning(
                    "listening for pending runs failed; the claimer polls meanwhile",
                    error=repr(exc)[:300],
                    retry_in_s=round(delay, 3),
                )
                await wait_for_stop(stop, delay)

    async def _listen(self, stop: asyncio.Event) -> None:
        async with self.pool.acquire() as conn:
            schema = await conn.fetchval("SELECT current_schema()")
            lost = asyncio.Event()

            def on_notify(_c: object, _pid: int, _channel: str, payload: object) -> None:
                due = parse_pending(str(payload), schema)
                if due is not None:
                    self.on_pending(due)

            def on_lost(_c: object) -> None:
                lost.set()

            # Both listeners are removed before the connection goes back to the
            # pool, which does not reset its connections (no session state kept).
            conn.add_termination_listener(on_lost)
            await conn.add_listener(PENDING_CHANNEL, on_notify)
            try:
                self.on_pending(_NOW)  # missed while not listening: look now
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if lost.is_set():
                    raise ConnectionError("the LISTEN connection was closed")
            finally:
                # A connection the server or the network killed has been handed
                # back to the pool already (asyncpg then refuses every call with
                # InterfaceError): nothing is left to remove from it.
                with contextlib.suppress(asyncpg.InterfaceError):
                    conn.remove_termination_listener(on_lost)
                    if not conn.is_closed():
                        with contextlib.suppress(Exception):
                            await conn.remove_listener(PENDING_CHANNEL, on_notify)  # UNLISTEN

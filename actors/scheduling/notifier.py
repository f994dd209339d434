"""The notifier: sends the outbox's notifications, each (run, event, sink) once.

Every replica runs one. A tick writes this replica's job policies when its
config changed, now and then recovers rows whose sender's lease expired and
scans for missed and too_long (idempotent: the outbox's unique key), then
claims a batch of due rows (SKIP LOCKED and a lease, like runs) and sends
them at once. A sink's failure is recorded as that attempt's answer and the
row is retried with exponential backoff until its attempt limit; a sender
that dies while sending leaves its attempt to be recorded as lost when its
lease is recovered, and the row is sent again: delivery is at least once,
and the receiver drops a duplicate by the delivery id (``X-Claimd-Delivery``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from datetime import timedelta

from actors.config.notify import NotifyConfig
from actors.domain.notify import Notification, Sink, retry_delay
from actors.observability import get_logger
from actors.observability.notify_metrics import (
    NOTIFICATIONS_DEAD,
    NOTIFICATIONS_OLDEST_PENDING,
    NOTIFICATIONS_PENDING,
    NOTIFICATIONS_SENT,
    init_notify_series,
)
from actors.pacing import wait_for_stop
from actors.ports.notify import NotificationStore, SendResult, SinkSender

log = get_logger("notifier")
# Rows claimed and sent at once by one replica.
NOTIFY_BATCH = 16
# Verdicts judged into notifications per tick.
VERDICT_BATCH = 1000
# Scans (missed, too_long, expired leases, the outbox's figures) every this many ticks.
SCAN_EVERY_TICKS = 5


class Notifier:
    """Claims due notifications and sends them; records every attempt."""

    def __init__(
        self,
        store: NotificationStore,
        senders: SinkSender,
        sender_id: str,
        config: Callable[[], tuple[NotifyConfig, Collection[str]]],
        stop: asyncio.Event,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.senders = senders
        self.sender_id = sender_id
        self.config = config
        self.stop = stop
        self.monotonic = monotonic
        # The config objects last written (held, so "is" cannot match a reused id).
        self._synced: tuple[object, object] | None = None
        self._next_scan = 0.0

    async def sync(self) -> NotifyConfig:
        """The policies of the config in force, written when it changed."""
        notify, jobs = self.config()
        # Identity: a reload replaces both objects (never edits them), so a tick of a
        # config of 100,000 jobs costs no comparison of their names.
        if self._synced is None or self._synced[0] is not notify or self._synced[1] is not jobs:
            policies = notify.policies(jobs)
            await self.store.sync_policies(policies)
            init_notify_series(sorted(notify.sinks))
            self._synced = (notify, jobs)
            log.info("notification policies written", jobs=len(policies), sinks=len(notify.sinks))
        return notify

    async def scan(self, notify: NotifyConfig) -> None:
        """Expired leases, missed and too_long, the outbox's figures."""
        delivery = notify.delivery
        recovered = await self.store.recover_expired(delivery.max_attempts)
        if recovered:
            log.warning("notifications whose sender stopped: sent again", rows=recovered)
        missed = await self.store.scan_missed(delivery.lookback)
        too_long = await self.store.scan_too_long()
        if missed or too_long:
            log.info("notifications found", missed=missed, too_long=too_long)
        figures = await self.store.figures()
        NOTIFICATIONS_PENDING.set(figures.pending)
        NOTIFICATIONS_OLDEST_PENDING.set(figures.oldest_s)
        NOTIFICATIONS_DEAD.set(figures.dead)

    async def tick(self) -> int:
        """One pass; how many notifications were claimed."""
        notify = await self.sync()
        while await self.store.judge_verdicts(VERDICT_BATCH) >= VERDICT_BATCH:
            pass  # a backlog (a herd's verdicts): judged before anything is claimed
        now = self.monotonic()
        if now >= self._next_scan:
            await self.scan(notify)
            self._next_scan = now + notify.delivery.interval.total_seconds() * SCAN_EVERY_TICKS
        batch = await self.store.claim(self.sender_id, NOTIFY_BATCH, notify.delivery.lease)
        if batch:
            await asyncio.gather(*(self._send(notify, n) for n in batch))
        return len(batch)

    async def _send(self, notify: NotifyConfig, n: Notification) -> None:
        delivery = notify.delivery
        sink = notify.sinks.get(n.sink)
        if sink is None:
            result = SendResult(
                delivered=False, error=f"no sink [notify.{n.sink}] in this replica's config"
            )
        else:
            answered = await self._send_unless_stopped(sink, n, delivery.timeout.total_seconds())
            if answered is None:
                # Stopping: the send is abandoned, its lease returns the row (attempt: lost).
                log.info("notification send abandoned at stop", run_id=n.run_id, sink=n.sink)
                return
            result = answered
        retry_in: timedelta = retry_delay(n.attempt, delivery.backoff, delivery.backoff_max)
        # The answer is recorded even if this task is cancelled meanwhile (a stop).
        state = await asyncio.shield(
            self.store.record(self.sender_id, n, result, retry_in, delivery.max_attempts)
        )
        outcome = "fenced" if state is None else ("delivered" if result.delivered else "failed")
        NOTIFICATIONS_SENT.labels(n.sink, n.event.value, outcome).inc()
        fields = {
            "run_id": n.run_id,
            "job": n.job,
            # Not "event": structlog's word for the log line's message.
            "notification": n.event.value,
            "sink": n.sink,
            "attempt": n.attempt,
            "status": result.status,
        }
        if result.delivered:
            log.info("notification sent", **fields)
        elif state == "dead":
            log.error("notification given up", error=result.error, **fields)
        else:
            log.warning(
                "notification not sent",
                error=result.error,
                retry_in_s=retry_in.total_seconds(),
                state=state,
                **fields,
            )

    async def _send_unless_stopped(
        self, sink: Sink, n: Notification, timeout: float
    ) -> SendResult | None:
        """The sink's answer; None if the replica began to stop first (a slow sink
        never holds a stop up to its timeout)."""
        send = asyncio.ensure_future(self.senders.send(sink, n, timeout))
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({send, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            send.cancel()
            raise
        finally:
            stopping.cancel()
        if send.done():
            return send.result()
        send.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await send
        return None

    async def run(self) -> None:
        try:
            while not self.stop.is_set():
                claimed = await self.tick()
                if claimed >= NOTIFY_BATCH:
                    continue  # more are due: no rest
                notify, _ = self.config()
                if await wait_for_stop(self.stop, notify.delivery.interval.total_seconds()):
                    break
        finally:
            await self.senders.close()

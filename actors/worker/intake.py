"""Intake: what the worker fetches, and when it fetches nothing.

A worker takes in only what it can keep. While its lease extensions, its
completions or its starts fail or hang (the database is away, or its
connection went silent), it fetches nothing: a run started then would finish
with nobody able to record it or extend its lease, and would be executed again
elsewhere after the lease. The runs it holds are left to their leases; the
other replicas take the new ones. Likewise while the broker does not answer
(the inbox says so: :class:`~actors.ports.InboxSilent`), it waits for the
broker to come back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from actors.observability import INTAKE_PAUSED, INTAKE_PAUSES, get_logger
from actors.pacing import Backoff, Probe, wait_for_stop
from actors.ports import Delivery, Inbox, InboxSilent
from actors.worker.heartbeat import Keeping

log = get_logger("worker")


class Intake:
    """Fetches from the inbox while the worker can keep what it starts."""

    def __init__(
        self,
        inbox: Inbox,
        keeping: Keeping,
        store_probe: Probe,
        stop: asyncio.Event,
        in_flight: Callable[[], int],
    ) -> None:
        self.inbox = inbox
        self.keeping = keeping
        self.store_probe = store_probe
        self.stop = stop
        self.in_flight = in_flight
        self.backoff = Backoff(initial=0.2, maximum=5.0)

    async def fetch(self, batch: int, timeout: float) -> Sequence[Delivery]:
        """Up to ``batch`` deliveries; none while the inbox fails (backed off) or is silent."""
        try:
            deliveries = await self.inbox.fetch(batch, timeout)
        except InboxSilent as exc:
            await self._until_broker_answers(str(exc))
            return ()
        except Exception as exc:  # noqa: BLE001 - fetch only talks to the broker: an outage
            delay = self.backoff.next_delay()
            log.warning("fetch failed", error=repr(exc), delay_s=round(delay, 3))
            await asyncio.sleep(delay)
            return ()
        if deliveries:
            self.backoff.reset()  # an empty fetch says nothing of the broker's health
        return deliveries

    async def until_kept(self) -> None:
        """Fetch nothing until the database calls the worker's runs depend on get through.

        A call that hangs is waited for (its own deadline ends it); a failure
        is retried by its owner (the heartbeat at each beat, the completer with
        backoff) and the database is pinged meanwhile: once it answers, beats
        and starts may go on, while unrecorded verdicts hold the pause until
        the completer records them.
        """
        trouble = self.keeping.trouble()
        if trouble is None:
            return
        began = self._paused(*trouble)
        backoff = Backoff(initial=0.1, maximum=1.0)
        while not self.stop.is_set():
            await wait_for_stop(self.stop, backoff.next_delay())
            if self.keeping.trouble() is None:
                break
            if self.keeping.stalled() is None and await self.store_probe():
                self.keeping.answered()
                if self.keeping.trouble() is None:
                    break
        self._resumed(trouble[0], began)

    async def _until_broker_answers(self, detail: str) -> None:
        """No fetch until the broker answers again."""
        began = self._paused("broker", detail)
        backoff = Backoff(initial=0.2, maximum=2.0)
        while not self.stop.is_set():
            await wait_for_stop(self.stop, backoff.next_delay())
            if await self.inbox.reconnect():
                break
        self._resumed("broker", began)

    def _paused(self, reason: str, detail: str) -> float:
        INTAKE_PAUSED.labels(actor="worker").set(1)
        INTAKE_PAUSES.labels(actor="worker", reason=reason).inc()
        log.warning(
            "worker takes no new runs: it could not keep them",
            reason=reason,
            detail=detail[:300],
            in_flight=self.in_flight(),
        )
        return time.monotonic()

    def _resumed(self, reason: str, began: float) -> None:
        INTAKE_PAUSED.labels(actor="worker").set(0)
        if not self.stop.is_set():
            log.warning(
                "worker takes new runs again",
                reason=reason,
                paused_s=round(time.monotonic() - began, 3),
            )

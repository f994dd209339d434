"""The dispatcher: one JetStream message per claimed run, many publishes in flight.

A failed publish sends that run to the compensator; the loop goes on with the
rest of the batch. While the broker gate is closed (this replica's publishes
fail), a batch claimed before it closed is not published at all: it goes to
the compensator at once, back to pending for the replicas that can publish,
instead of waiting out a publish timeout for every run.
"""

from __future__ import annotations

import asyncio

from actors.domain import ClaimedRun
from actors.flow import BrokerGate, ClaimedBatch
from actors.observability import PUBLISH_FAILED, PUBLISHED, get_logger
from actors.ports import Broker, DispatchMessage

log = get_logger("dispatcher")


class Dispatcher:
    """Publishes claimed batches; returns unpublished runs to the compensator."""

    def __init__(
        self,
        broker: Broker,
        deployment: str,
        inbox: asyncio.Queue[ClaimedBatch | None],
        compensate: asyncio.Queue[tuple[ClaimedRun, ...] | None],
        gate: BrokerGate,
    ) -> None:
        self.broker = broker
        self.deployment = deployment
        self.inbox = inbox
        self.compensate = compensate
        self.gate = gate

    def message(self, run: ClaimedRun) -> DispatchMessage:
        return DispatchMessage(
            run_id=run.run_id,
            epoch=run.epoch,
            job=run.job,
            scheduled_at=run.scheduled_at,
            attempt=run.attempt,
            deployment=self.deployment,
            due_at=run.due_at,
            executor=run.executor,
        )

    async def dispatch(self, batch: ClaimedBatch) -> list[ClaimedRun]:
        """Publish a batch; returns the runs whose publish failed (already sent on)."""
        runs = batch.runs
        if not self.gate.is_open:
            log.info(
                "broker unhealthy for this replica; batch released unpublished",
                runs=len(runs),
                error=self.gate.last_error,
            )
            await self.compensate.put(tuple(runs))
            return list(runs)
        try:
            results = await self.broker.publish_many([self.message(r) for r in runs])
        except Exception as exc:  # noqa: BLE001 - whatever broke, every run is accounted for
            log.warning("publish of batch failed", runs=len(runs), error=repr(exc))
            results = [exc] * len(runs)
        failed = []
        for run, error in zip(runs, results, strict=True):
            if error is None:
                continue
            failed.append(run)
            log.warning(
                "publish failed; run goes to the compensator",
                run_id=run.run_id,
                job=run.job,
                epoch=run.epoch,
                error=repr(error),
            )
        PUBLISHED.inc(len(runs) - len(failed))
        if failed:
            PUBLISH_FAILED.inc(len(failed))
            delay = self.gate.failed()
            log.info(
                "claiming paused while the broker fails", delay_s=round(delay, 3), runs=len(failed)
            )
            await self.compensate.put(tuple(failed))
        else:
            self.gate.succeeded()
        return failed

    async def run(self) -> None:
        """Until the claimer's end-of-stream (None): every batch is published or released."""
        while (batch := await self.inbox.get()) is not None:
            await self.dispatch(batch)

"""The dispatcher: one JetStream message per claimed run, many publishes in flight.

A failed publish sends that run to the compensator; the loop goes on with the
rest of the batch. While the broker gate is closed (this replica's publishes
fail), a batch claimed before it closed is not published at all: it goes to
the compensator at once, back to pending for the replicas that can publish,
instead of waiting out a publish timeout for every run.

A batch is published ``PUBLISH_CHUNK`` runs at a time, each chunk under its
own publish timeout: the claimer's passes grow for a herd (up to 4 x
``claim_batch``), and one deadline for 2,000 publishes on a loaded host is a
whole batch sent back to be claimed again where 500 went through.
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field

from actors.domain import ClaimedRun
from actors.observability import PUBLISH_FAILED, PUBLISHED
from actors.observability.tracing import Span, run_attributes, tracing
from actors.pacing import BrokerGate, ClaimedBatch
from actors.ports import Broker, DispatchMessage
from actors.scheduling.runtime import Runtime

PUBLISH_CHUNK = 500  # runs published under one deadline (the default claim_batch)


@dataclass(eq=False)
class Dispatcher:
    """Publishes claimed batches; returns unpublished runs to the compensator."""

    broker: Broker
    deployment: str
    inbox: asyncio.Queue[ClaimedBatch | None]
    compensate: asyncio.Queue[tuple[ClaimedRun, ...] | None]
    gate: BrokerGate
    _: KW_ONLY
    runtime: Runtime = field(default_factory=Runtime.local)

    def __post_init__(self) -> None:
        self.log = self.runtime.logger("dispatcher")

    def message(
        self, run: ClaimedRun, trace_context: tuple[tuple[str, str], ...] = ()
    ) -> DispatchMessage:
        return DispatchMessage(
            run_id=run.run_id,
            epoch=run.epoch,
            job=run.job,
            scheduled_at=run.scheduled_at,
            attempt=run.attempt,
            deployment=self.deployment,
            due_at=run.due_at,
            executor=run.executor,
            trace_context=trace_context,
        )

    async def dispatch(self, batch: ClaimedBatch) -> list[ClaimedRun]:
        """Publish a batch; returns the runs whose publish failed (already sent on).

        Logs a warning for the failure that begins an outage (the gate was
        open); the failed tries inside it (the gate's trials) are debug lines:
        the claimer says once that it backs off, and once that it resumed.
        """
        runs = batch.runs
        if not self.gate.is_open and not batch.trial:
            self.log.info(
                "broker unhealthy for this replica; batch released unpublished",
                runs=len(runs),
                error=self.gate.last_error,
            )
            await self.compensate.put(tuple(runs))
            return list(runs)
        tracer = tracing()
        spans: list[Span] = []
        if tracer.enabled:
            spans = [tracer.start("claimd.dispatch", _attributes(r)) for r in runs]
            messages = [
                self.message(r, tuple(tracer.context_of(s).items()))
                for r, s in zip(runs, spans, strict=True)
            ]
        else:
            messages = [self.message(r) for r in runs]
        try:
            results = await self.broker.publish_many(messages)
        except Exception as exc:  # noqa: BLE001 - whatever broke, every run is accounted for
            results = [exc] * len(runs)
        for span, result in zip(spans, results, strict=False):
            tracer.end(span, None if result is None else repr(result))
        failed = [(run, error) for run, error in zip(runs, results, strict=True) if error]
        PUBLISHED.inc(len(runs) - len(failed))
        if not failed:
            self.gate.succeeded()
            return []
        PUBLISH_FAILED.inc(len(failed))
        error = failed[0][1]
        first = (str(error) or repr(error))[:300]  # a JetStream refusal says why in str()
        say = self.log.debug if batch.trial else self.log.warning
        say(
            "publish failed; runs go to the compensator",
            runs=len(failed),
            of=len(runs),
            run_ids=[run.run_id for run, _ in failed][:20],
            error=first,
            trial=batch.trial,
        )
        delay = self.gate.failed(first)
        self.log.debug("claiming paused while the broker fails", delay_s=round(delay, 3))
        await self.compensate.put(tuple(run for run, _ in failed))
        return [run for run, _ in failed]

    async def run(self) -> None:
        """Until the claimer's end-of-stream (None): every batch is published or released."""
        while (batch := await self.inbox.get()) is not None:
            for chunk in chunks(batch):
                await self.dispatch(chunk)


def chunks(batch: ClaimedBatch) -> list[ClaimedBatch]:
    """The batch in pieces of at most ``PUBLISH_CHUNK`` runs (a trial stays whole)."""
    runs = batch.runs
    if len(runs) <= PUBLISH_CHUNK:
        return [batch]
    return [
        ClaimedBatch(runs[i : i + PUBLISH_CHUNK], trial=batch.trial)
        for i in range(0, len(runs), PUBLISH_CHUNK)
    ]


def _attributes(run: ClaimedRun) -> dict[str, object]:
    attributes = run_attributes(run.run_id, run.job, run.scheduled_at, run.epoch, run.attempt)
    if run.due_at is not None:
        attributes["claimd.due_at"] = run.due_at.isoformat()
    return attributes

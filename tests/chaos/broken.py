"""Broken builds: a replica's production adapters with one protection removed.

The harness proves that it catches a bug by running replicas with a fault in
them. They are composed here, on ``ProductionPorts`` with faulty wrappers
around what they open, and run by an entry point of the harness's own
(``python -m tests.chaos.broken_replica``, see ``command``). `claimd run` has no
switch that turns any of this on: the production package does not import this
module, and an import-linter contract says so.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import asyncpg

from actors.adapters.postgres import PostgresRunStore
from actors.observability import get_logger
from actors.ports import Completion, DispatchMessage, ReplicaBroker, ReplicaStore, WorkerStore
from actors.replica.production import ProductionPorts

log = get_logger("faults")

# The status a replica built with ``exit_after_complete`` exits with.
EXIT_STATUS = 97


@dataclass(frozen=True)
class Faults:
    """What a broken build breaks; the default breaks nothing."""

    # Completions recorded whatever epoch holds the run now: a zombie's late
    # completion overwrites the newer attempt (what the harness's epoch-guard
    # build must be caught doing).
    skip_epoch_guard: bool = False
    # The process exits (EXIT_STATUS) right after the Nth batch of completions
    # was recorded, before any of it is acked: the crash between record and ack.
    exit_after_complete: int = 0
    # Every Nth publish fails before it is sent: an unpublished claim must go
    # back to pending (the compensator) and be published again.
    publish_fail_every: int = 0

    def args(self) -> list[str]:
        """These faults as the options of ``python -m tests.chaos.broken_replica``."""
        out = ["--skip-epoch-guard"] if self.skip_epoch_guard else []
        if self.exit_after_complete > 0:
            out += ["--exit-after-complete", str(self.exit_after_complete)]
        if self.publish_fail_every > 0:
            out += ["--publish-fail-every", str(self.publish_fail_every)]
        return out

    def __bool__(self) -> bool:
        return self != Faults()


def command(faults: Faults) -> list[str]:
    """The command that runs a replica with ``faults``; claimd's own options follow it.

    Run with the repository on ``PYTHONPATH`` (``tests`` is not installed).
    """
    return [sys.executable, "-m", "tests.chaos.broken_replica", *faults.args()]


# The epoch each running run holds now, read just before a forged completion.
_CURRENT_EPOCHS = """
SELECT id::text AS id, claim_epoch FROM job_runs WHERE id = ANY ($1::uuid[]) AND state = 'running'
"""


class UnfencedCompletions:
    """The worker's store, except that every completion carries the run's current epoch.

    A completion whose fencing token is forged to whatever the run holds now is
    what a completion without its epoch guard amounts to. The statement that
    records it is the production one, untouched: this build does not depend on
    the text of the fence (and a change to that text cannot break this build).
    """

    def __init__(self, store: WorkerStore, pool: asyncpg.Pool) -> None:
        self._store = store
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        """Record ``completions`` under the epochs their runs hold now, not their own."""
        rows = await self._pool.fetch(_CURRENT_EPOCHS, [c.run_id for c in completions])
        current = {r["id"]: r["claim_epoch"] for r in rows}
        forged = [dataclasses.replace(c, epoch=current.get(c.run_id, c.epoch)) for c in completions]
        return await self._store.complete_runs(forged)


class ExitAfterComplete:
    """The worker's store, except that the process exits after the Nth recorded batch."""

    def __init__(
        self, store: WorkerStore, after: int, exit: Callable[[int], object] = os._exit
    ) -> None:
        self._store = store
        self._after = after
        self._exit = exit
        self.recorded_batches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        """Record, then exit if this was the Nth batch (before the caller can ack)."""
        recorded = await self._store.complete_runs(completions)
        self.recorded_batches += 1
        if self.recorded_batches >= self._after:
            log.warning("fault injection: exiting after complete, before ack")
            self._exit(EXIT_STATUS)
        return recorded


class FailingPublishes:
    """A broker whose every ``every``-th publish fails (counted over its life); 0: none."""

    def __init__(self, broker: ReplicaBroker, every: int) -> None:
        self.broker = broker
        self.every = every
        self._count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.broker, name)

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
        """One result per message; the doomed ones fail without being sent."""
        doomed = []
        for _ in messages:
            self._count += 1
            doomed.append(self.every > 0 and self._count % self.every == 0)
        sent = [m for m, fails in zip(messages, doomed, strict=True) if not fails]
        results = iter(await self.broker.publish_many(sent) if sent else [])
        return [
            ConnectionError("injected publish failure") if fails else next(results)
            for fails in doomed
        ]


@dataclass
class BrokenPorts(ProductionPorts):
    """`claimd run`'s adapters, with ``faults`` wrapped around what they open."""

    faults: Faults = field(default_factory=Faults)

    async def open_broker(self) -> ReplicaBroker:
        broker = await super().open_broker()
        every = self.faults.publish_fail_every
        if every <= 0:
            return broker
        log.warning("test fault installed: publishes fail", every=every)
        return cast(ReplicaBroker, FailingPublishes(broker, every))

    def worker_store(self, store: ReplicaStore) -> WorkerStore:
        recording = super().worker_store(store)
        if self.faults.skip_epoch_guard:
            assert isinstance(store, PostgresRunStore), "opened by ProductionPorts.open_store"
            log.warning("test fault installed: completions are not fenced by epoch")
            recording = cast(WorkerStore, UnfencedCompletions(recording, store.pool))
        after = self.faults.exit_after_complete
        if after > 0:
            log.warning(
                "test fault installed: the process exits after recording, before acking",
                after_batches=after,
            )
            recording = cast(WorkerStore, ExitAfterComplete(recording, after))
        return recording

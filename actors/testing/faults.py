"""Broken builds for the chaos harness, installed around the store at start-up.

The harness proves that it catches a bug by running a replica with one
protection removed. The environment is read once, when the replica starts
(actors.app); nothing on a production path reads it or knows these exist.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from actors.adapters.postgres import COMPLETE_RUNS, PostgresRunStore
from actors.observability import get_logger
from actors.ports import Completion, DispatchMessage, ReplicaBroker, RunStore

log = get_logger("faults")

# CLAIMD_FAULT_EXIT_AFTER_COMPLETE=N: the process exits (status 97) right
# after the Nth batch of completions was recorded, before any of it is
# acked: the crash between record and ack, with a real process.
EXIT_AFTER_COMPLETE = "CLAIMD_FAULT_EXIT_AFTER_COMPLETE"
EXIT_STATUS = 97

# CLAIMD_FAULT_SKIP_EPOCH_GUARD=1: completions without their epoch guard, so
# the harness can show that it catches a zombie's late completion
# overwriting a newer attempt. Never set it outside the harness.
SKIP_EPOCH_GUARD = "CLAIMD_FAULT_SKIP_EPOCH_GUARD"

_FENCE = "r.claim_epoch = c.epoch AND r.state = 'running'"
# The same statement without its epoch guard.
COMPLETE_RUNS_UNFENCED = COMPLETE_RUNS.replace(_FENCE, "r.state = 'running'")
assert COMPLETE_RUNS_UNFENCED != COMPLETE_RUNS, "the completion's epoch guard moved"


def install_store_faults(
    store: PostgresRunStore, environ: Mapping[str, str] = os.environ
) -> PostgresRunStore:
    """``store``, with the broken builds the environment asks for (usually none)."""
    if environ.get(SKIP_EPOCH_GUARD) == "1":
        log.warning(
            "test fault installed: completions are not fenced by epoch", fault=SKIP_EPOCH_GUARD
        )
        store.complete_statement = COMPLETE_RUNS_UNFENCED
    return store


class ExitAfterComplete:
    """The worker's store, except that the process exits after the Nth recorded batch."""

    def __init__(
        self, store: RunStore, after: int, exit: Callable[[int], object] = os._exit
    ) -> None:
        self._store = store
        self._after = after
        self._exit = exit
        self.recorded_batches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def complete_runs(self, completions: Sequence[Completion]) -> set[tuple[str, int]]:
        recorded = await self._store.complete_runs(completions)
        self.recorded_batches += 1
        if self.recorded_batches >= self._after:
            log.warning(
                "fault injection: exiting after complete, before ack", fault=EXIT_AFTER_COMPLETE
            )
            self._exit(EXIT_STATUS)
        return recorded


def install_worker_faults(store: RunStore, environ: Mapping[str, str] = os.environ) -> RunStore:
    """The store the worker records through, with the faults the environment asks for."""
    after = int(environ.get(EXIT_AFTER_COMPLETE, "0") or 0)
    if after <= 0:
        return store
    log.warning(
        "test fault installed: the process exits after recording, before acking",
        fault=EXIT_AFTER_COMPLETE,
        after_batches=after,
    )
    return cast(RunStore, ExitAfterComplete(store, after))


# CLAIMD_FAULT_PUBLISH_FAIL_EVERY=N: every Nth publish fails before it is
# sent, so the harness can show that an unpublished claim goes back to
# pending (the compensator) and is published again.
PUBLISH_FAIL_EVERY = "CLAIMD_FAULT_PUBLISH_FAIL_EVERY"


class FailingPublishes:
    """A broker whose every ``every``-th publish fails (counted over its life); 0: none."""

    def __init__(self, broker: ReplicaBroker, every: int) -> None:
        self.broker = broker
        self.every = every
        self._count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.broker, name)

    async def publish_many(self, messages: Sequence[DispatchMessage]) -> list[BaseException | None]:
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


def install_broker_faults(
    broker: ReplicaBroker, environ: Mapping[str, str] = os.environ
) -> ReplicaBroker:
    """``broker``, failing publishes as the environment asks (usually not at all)."""
    every = int(environ.get(PUBLISH_FAIL_EVERY, "0") or 0)
    if every <= 0:
        return broker
    log.warning("test fault installed: publishes fail", fault=PUBLISH_FAIL_EVERY, every=every)
    return cast(ReplicaBroker, FailingPublishes(broker, every))

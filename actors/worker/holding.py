"""What a worker holds: the runs executing here and the verdicts waiting to be recorded."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass

from actors.observability import RUNS_IN_FLIGHT, get_logger
from actors.observability.tracing import Span
from actors.ports import Completion
from actors.worker.heartbeat import InFlight, Settle

log = get_logger("worker")

Key = tuple[str, int]  # (run id, epoch)


@dataclass
class Pending:
    """A verdict to record, with the delivery to ack once it is."""

    completion: Completion
    delivery: Settle
    job: str
    # The run's trace span (tracing on), ended once the verdict is recorded.
    span: Span = None


class Holding:
    """The in-flight set (heartbeated), the verdicts queued for the completer, the slots.

    Two pools of slots. ``concurrency`` slots for work that takes a process, a
    thread or an outbound connection of its own (shell, http), and
    ``inline_concurrency`` for python callables: async ones run in this process
    (on the job event loop) and cost a task each, sync ones wait their turn for a
    warm child of the executor's pool, which bounds them: a herd of them does not
    wait behind the shell jobs' slots, nor for them. A slot is taken from the moment a
    delivery is admitted to a start until its execution ends. It is free again
    once the verdict is queued, while the run stays in the in-flight set, and
    heartbeated, until the verdict is recorded and the message acked. What waits
    to be recorded is bounded by the completion queue (an execution whose
    verdict finds the queue full keeps its slot until it is let in), so
    recording does not hold up the next executions.
    """

    def __init__(self, concurrency: int, inline_concurrency: int = 0) -> None:
        self.concurrency = concurrency
        self.inline_concurrency = inline_concurrency
        self.in_flight: dict[Key, InFlight] = {}
        self.completions: asyncio.Queue[Pending | None] = asyncio.Queue(
            maxsize=max(concurrency * 2, min(inline_concurrency, 4096))
        )
        # Runs in a start not yet answered: a copy of one fetched meanwhile must
        # not start it again (nor, as a start whose reply was lost, take it up).
        self.starting: set[Key] = set()
        # Read when scraped, not set per run (a herd set it 10,000 times a second).
        RUNS_IN_FLIGHT.set_function(lambda: len(self.in_flight))
        self.busy = 0  # slots taken: deliveries being started, executions not ended
        self.inline_busy = 0  # the same, of python callables
        self.slot_freed = asyncio.Event()

    def free(self, inline: bool = False) -> int:
        """Slots free in a pool (an inline run takes a slot of its own pool)."""
        if inline and self.inline_concurrency:
            return self.inline_concurrency - self.inline_busy
        return self.concurrency - self.busy

    def take(self, slots: int, inline: bool = False) -> None:
        if inline and self.inline_concurrency:
            self.inline_busy += slots
        else:
            self.busy += slots

    def give(self, slots: int, inline: bool = False) -> None:
        if inline and self.inline_concurrency:
            self.inline_busy -= slots
        else:
            self.busy -= slots
        self.slot_freed.set()

    def given(self, slots: int, inline: bool, _: asyncio.Task[None]) -> None:
        """A done callback: ``slots`` held by that task are free (it ended, or never began)."""
        self.give(slots, inline)

    def executing(self, task: asyncio.Task[None], inline: bool = False) -> None:
        """``task`` holds a slot until it ends (its verdict queued, or cancelled)."""
        self.take(1, inline)
        task.add_done_callback(functools.partial(self.given, 1, inline))

    def hold(self, entry: InFlight) -> None:
        self.in_flight[(entry.run_id, entry.epoch)] = entry

    def forget(self, entry: InFlight) -> None:
        """The run leaves the in-flight set: no longer heartbeated."""
        self.in_flight.pop((entry.run_id, entry.epoch), None)

"""What a worker holds: the runs executing here and the verdicts waiting to be recorded."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from dataclasses import dataclass

from actors.observability import RUNS_IN_FLIGHT, get_logger
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


class Holding:
    """The in-flight set (heartbeated), the verdicts queued for the completer, the slots.

    A slot (``concurrency`` of them) is taken from the fetch of a delivery
    until its execution ends: its start, then its execution. It is free again
    once the verdict is queued, while the run stays in the in-flight set, and
    heartbeated, until the verdict is recorded and the message acked. What waits
    to be recorded is bounded by the completion queue (an execution whose
    verdict finds the queue full keeps its slot until it is let in), so
    recording does not hold up the next executions.
    """

    def __init__(self, concurrency: int) -> None:
        self.in_flight: dict[Key, InFlight] = {}
        self.completions: asyncio.Queue[Pending | None] = asyncio.Queue(maxsize=concurrency * 2)
        # Runs in a start not yet answered: a copy of one fetched meanwhile must
        # not start it again (nor, as a start whose reply was lost, take it up).
        self.starting: set[Key] = set()
        self.busy = 0  # slots taken: deliveries being started, executions not ended
        self.slot_freed = asyncio.Event()

    def take(self, slots: int) -> None:
        self.busy += slots

    def give(self, slots: int) -> None:
        self.busy -= slots
        self.slot_freed.set()

    def given(self, slots: int, _: asyncio.Task[None]) -> None:
        """A done callback: ``slots`` held by that task are free (it ended, or never began)."""
        self.give(slots)

    def executing(self, task: asyncio.Task[None]) -> None:
        """``task`` holds a slot until it ends (its verdict queued, or cancelled)."""
        self.take(1)
        task.add_done_callback(functools.partial(self.given, 1))

    def hold(self, entry: InFlight) -> None:
        self.in_flight[(entry.run_id, entry.epoch)] = entry
        RUNS_IN_FLIGHT.set(len(self.in_flight))

    def forget(self, entry: InFlight) -> None:
        """The run leaves the in-flight set: no longer heartbeated."""
        self.in_flight.pop((entry.run_id, entry.epoch), None)
        RUNS_IN_FLIGHT.set(len(self.in_flight))


async def quietly(reply: Awaitable[object]) -> None:
    """Ack/term/nak are best effort: a lost ack means a redelivery, which changes nothing."""
    try:
        await reply
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        log.warning("broker reply failed", error=repr(exc))

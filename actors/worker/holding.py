"""What a worker holds: the runs executing here and the verdicts waiting to be recorded."""

from __future__ import annotations

import asyncio
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
    """The in-flight set (heartbeated), the verdicts queued for the completer, a free slot."""

    def __init__(self, concurrency: int) -> None:
        self.in_flight: dict[Key, InFlight] = {}
        self.completions: asyncio.Queue[Pending | None] = asyncio.Queue(maxsize=concurrency * 2)
        self.slot_freed = asyncio.Event()

    def hold(self, entry: InFlight) -> None:
        self.in_flight[(entry.run_id, entry.epoch)] = entry
        RUNS_IN_FLIGHT.set(len(self.in_flight))

    def forget(self, entry: InFlight) -> None:
        """The run leaves the in-flight set: no longer heartbeated, its slot free."""
        self.in_flight.pop((entry.run_id, entry.epoch), None)
        RUNS_IN_FLIGHT.set(len(self.in_flight))
        self.slot_freed.set()


async def quietly(reply: Awaitable[object]) -> None:
    """Ack/term/nak are best effort: a lost ack means a redelivery, which changes nothing."""
    try:
        await reply
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        log.warning("broker reply failed", error=repr(exc))

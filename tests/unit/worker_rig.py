"""A worker on the in-memory inbox, the fake store and a gated executor, for unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from actors.testing.memory import ManualClock
from actors.testing.memory_inbox import MemoryInbox
from actors.worker import Worker, WorkerSettings
from tests.fakes import FixedClock, GatedExecutor, WorkerStore


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` until it holds, failing with ``what`` after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class Seconds:
    """A monotonic clock for the inbox that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, clock: FixedClock | ManualClock | None = None, **settings: Any) -> None:
        self.store = WorkerStore()
        self.seconds = Seconds()
        self.inbox = MemoryInbox(ack_wait=30.0, clock=self.seconds)
        self.executor = GatedExecutor()
        self.clock = clock or FixedClock()
        self.stop = asyncio.Event()
        fields: dict[str, Any] = {
            "worker_id": "w",
            "deployment": "d",
            "lease": timedelta(seconds=30),
            # Long: no heartbeat (and no in_progress) unless a test asks for one.
            "heartbeat_interval": timedelta(hours=1),
            "concurrency": 8,
            "grace": timedelta(seconds=5),
            "stall_after": timedelta(seconds=5),
        }
        self.worker = Worker(
            self.store.as_port(),
            self.inbox,
            self.executor,
            WorkerSettings(**(fields | settings)),
            stop=self.stop,
            clock=self.clock,
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.worker.run())
        return self.task

    async def stopped(self, *, finish: bool = True) -> None:
        """Stop the worker (letting its executions finish first unless told not to)."""
        self.stop.set()
        if finish:
            self.executor.finish.set()
        self.inbox.interrupt()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)

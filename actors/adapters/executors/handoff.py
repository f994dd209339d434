"""Calls handed from one thread to an event loop on another, many per wake-up.

``loop.call_soon_threadsafe`` wakes the loop's thread for every call: a herd
of 10,000 async jobs at one instant handed the job loop 10,000 wake-ups, and
each job's end as many back to the worker's loop, and the two threads passed
the GIL to each other at every one (10,000 no-op jobs took 7 s of wall clock
for 2 s of CPU). A :class:`Handoff` queues the calls and wakes its loop once
for all that are waiting: the loop runs them in order, in slices of
``SLICE`` so that a herd does not hold the loop in one callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable

SLICE = 1_000  # calls run in one callback at most; the rest in the next turn of the loop


class Handoff:
    """Calls for ``loop``, from any thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._woken = False  # a drain is scheduled and has not yet taken the calls

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the loop soon (a closed loop runs nothing)."""
        with self._lock:
            self._calls.append(fn)
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch = [self._calls.popleft() for _ in range(min(SLICE, len(self._calls)))]
            more = bool(self._calls)
            self._woken = more
        if more:
            self.loop.call_soon(self._drain)  # this loop's own thread: no wake-up needed
        for fn in batch:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - one call's bug must not drop the others
                self.loop.call_exception_handler(
                    {"message": "a handed-off call raised", "exception": exc}
                )

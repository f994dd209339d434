"""The supervisor: restarts a crashed actor with backoff, gives up after too many.

A plain TaskGroup would cancel every sibling on the first crash. Each actor
instead runs inside :func:`supervise`, which catches ``Exception`` (never
BaseException: cancellation goes through), logs it with the actor's name,
backs off exponentially and restarts; more than ``max_restarts`` crashes in
``window`` seconds re-raise, so the group, and then the process, stops with a
non-zero exit and the platform restarts it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from actors.flow import Backoff
from actors.observability import ACTOR_RESTARTS, get_logger

log = get_logger("supervisor")


class ActorGaveUp(RuntimeError):
    """An actor crashed more often than the restart budget allows."""


async def supervise(name: str, start: Callable[[], Awaitable[None]], *, max_restarts: int = 5,
                    window: float = 60.0, backoff: Backoff | None = None) -> None:
    """Run ``start()`` until it returns; restart it when it raises."""
    crashes: deque[float] = deque()
    backoff = backoff or Backoff(initial=0.2, maximum=10.0)
    while True:
        try:
            await start()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            now = time.monotonic()
            crashes.append(now)
            while crashes and crashes[0] < now - window:
                crashes.popleft()
            if len(crashes) > max_restarts:
                log.error("actor gave up", name=name, crashes=len(crashes), window_s=window,
                          exc_info=True)
                raise ActorGaveUp(f"{name} crashed {len(crashes)} times in {window}s") from exc
            delay = backoff.next_delay()
            ACTOR_RESTARTS.labels(actor=name).inc()
            log.warning("actor crashed; restarting", name=name, delay_s=round(delay, 3),
                        error=repr(exc), exc_info=True)
            await asyncio.sleep(delay)

"""The supervisor: restarts a crashed actor with backoff, gives up after too many.

A plain TaskGroup would cancel every sibling on the first crash. An actor
that stops because a server is away (``ports.Outage``: the database
restarting, say) is restarted as soon as the server is back, with a backoff
capped at 5 s, and that never counts as a crash. Each actor
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
from actors.observability import ACTOR_OUTAGES, ACTOR_RESTARTS, get_logger
from actors.ports import Outage

log = get_logger("supervisor")


# An actor that ran this long before failing starts its backoff from the bottom.
HEALTHY_AFTER = 30.0


class ActorGaveUp(RuntimeError):
    """An actor crashed more often than the restart budget allows."""


async def supervise(
    name: str,
    start: Callable[[], Awaitable[None]],
    *,
    max_restarts: int = 5,
    window: float = 60.0,
    backoff: Backoff | None = None,
    outage_backoff: Backoff | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``start()`` until it returns; restart it when it raises.

    ``monotonic`` is the clock the crash window and the healthy run are
    measured on (tests move a fake one).
    """
    crashes: deque[float] = deque()
    backoff = backoff or Backoff(initial=0.2, maximum=10.0)
    outage_backoff = outage_backoff or Backoff(initial=0.1, maximum=5.0)
    while True:
        started = monotonic()
        try:
            await start()
            return
        except asyncio.CancelledError:
            raise
        except Outage as exc:
            # A server is away: wait and retry, as long as it takes. Not a crash.
            if monotonic() - started > HEALTHY_AFTER:
                outage_backoff.reset()
            delay = min(outage_backoff.next_delay(), 5.0)
            ACTOR_OUTAGES.labels(actor=name).inc()
            log.warning(
                "server unavailable; actor restarts when it is back",
                name=name,
                delay_s=round(delay, 3),
                error=str(exc)[:300],
            )
            await asyncio.sleep(delay)
            continue
        except Exception as exc:
            now = monotonic()
            crashes.append(now)
            while crashes and crashes[0] < now - window:
                crashes.popleft()
            if len(crashes) > max_restarts:
                log.error(
                    "actor gave up", name=name, crashes=len(crashes), window_s=window, exc_info=True
                )
                raise ActorGaveUp(f"{name} crashed {len(crashes)} times in {window}s") from exc
            if monotonic() - started > HEALTHY_AFTER:
                backoff.reset()
            delay = backoff.next_delay()
            ACTOR_RESTARTS.labels(actor=name).inc()
            log.warning(
                "actor crashed; restarting",
                name=name,
                delay_s=round(delay, 3),
                error=repr(exc),
                exc_info=True,
            )
            await asyncio.sleep(delay)

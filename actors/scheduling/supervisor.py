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

Inside one outage an actor may be restarted many times (every few seconds
while a database is read-only, say): that is said once, when the outage
begins for the actor, and once when it ends (the actor ran
``settled_after`` seconds without meeting the outage again, or finished, or
crashed), with the number of restarts between; the restarts in between are
logged at debug and counted in ``claimd_actor_outages_total``, as dependency
health says an outage once (actors.observability.DependencyHealth).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from actors import clocks
from actors.observability import ACTOR_OUTAGES, ACTOR_RESTARTS, get_logger
from actors.pacing import Backoff
from actors.ports import Outage

log = get_logger("supervisor")


# An actor that ran this long before failing starts its backoff from the bottom.
HEALTHY_AFTER = 30.0
# An actor restarted in an outage that then runs this long is past it (the
# outage backoff's cap: a restart that fails again does so within a step).
RUNNING_AGAIN_AFTER = 5.0


class _ActorOutage:
    """One actor's outage: begun at its first Outage, over once the actor runs again."""

    def __init__(self, name: str, monotonic: Callable[[], float]) -> None:
        self.name = name
        self.monotonic = monotonic
        self.began: float | None = None
        self.restarts = 0
        self.error = ""

    def restarted(self, exc: Outage, delay: float) -> None:
        """The actor stopped on an outage and restarts after ``delay``: said once per outage."""
        ACTOR_OUTAGES.labels(actor=self.name).inc()
        self.restarts += 1
        error = str(exc)[:300]
        fields = {"name": self.name, "delay_s": round(delay, 3), "error": error}
        if self.began is None:
            self.began = self.monotonic()
            self.error = error
            log.warning("server unavailable; actor restarts when it is back", **fields)
        else:
            log.debug("server still unavailable; actor restarts", restarts=self.restarts, **fields)

    def over(self, how: str) -> None:
        """The actor ran again (``how``): the outage, if one was under way, ends here."""
        if self.began is None:
            return
        log.warning(
            "actor running again after a server outage",
            name=self.name,
            restarts=self.restarts,
            outage_s=round(self.monotonic() - self.began, 3),
            how=how,
            error=self.error,
        )
        self.began = None
        self.restarts = 0


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
    monotonic: Callable[[], float] = clocks.monotonic,
    settled_after: float = RUNNING_AGAIN_AFTER,
) -> None:
    """Run ``start()`` until it returns; restart it when it raises.

    ``monotonic`` is the clock the crash window and the healthy run are
    measured on (tests move a fake one); ``settled_after`` (seconds of the
    event loop's clock) how long an actor restarted in an outage runs before
    the outage is over for it.
    """
    crashes: deque[float] = deque()
    backoff = backoff or Backoff(initial=0.2, maximum=10.0)
    outage_backoff = outage_backoff or Backoff(initial=0.1, maximum=5.0)
    outage = _ActorOutage(name, monotonic)
    loop = asyncio.get_running_loop()
    while True:
        started = monotonic()
        # Restarted in an outage: running settled_after seconds ends it.
        settled = loop.call_later(settled_after, outage.over, "ran") if outage.began else None
        try:
            try:
                await start()
            finally:
                if settled is not None:
                    settled.cancel()
            outage.over("finished")
            return
        except asyncio.CancelledError:
            raise
        except Outage as exc:
            # A server is away: wait and retry, as long as it takes. Not a crash.
            if monotonic() - started > HEALTHY_AFTER:
                outage_backoff.reset()
            delay = min(outage_backoff.next_delay(), 5.0)
            outage.restarted(exc, delay)
            await asyncio.sleep(delay)
            continue
        except Exception as exc:
            outage.over("crashed")
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

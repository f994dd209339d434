"""A replica's life: waiting for its servers at start, and a stop that is bounded.

The promise: from SIGTERM to the end of the process takes at most
:func:`stop_bound` seconds. In-flight work gets the shutdown grace; past it
plus a margin, everything left is cancelled (the leases recover it); and a
watchdog thread, armed by the signal, exits the process if even that hangs
(a cancelled task still waiting on a silent connection, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from actors.domain import ClaimedRun
from actors.observability import get_logger, redact
from actors.pacing import Backoff

log = get_logger("replica")
T = TypeVar("T")

# How long past the shutdown grace a stop may take before it is forced
# (everything left is cancelled; the leases recover it).
STOP_MARGIN_S = 15.0
# How long after that the process may still take to wind down (closing
# connections, cancelled tasks that wait on a silent link) before it exits
# at once, whatever it is waiting for.
EXIT_MARGIN_S = 5.0
# Forced exit's status (the stop did not finish cleanly; same as a forced stop).
FORCED_EXIT_CODE = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_bound(grace: float) -> float:
    """Seconds from SIGTERM to the end of the process, at most: the promise."""
    return grace + STOP_MARGIN_S + EXIT_MARGIN_S


def on_signals(signals: tuple[signal.Signals, ...], handler: Callable[[], None]) -> None:
    """Install ``handler`` for ``signals`` where the loop can (not on every platform)."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


def off_signals(signals: tuple[signal.Signals, ...]) -> None:
    loop = asyncio.get_running_loop()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(sig)


async def until_connected(
    stop: asyncio.Event,
    what: str,
    connect: Callable[[], Coroutine[Any, Any, T]],
    transient: Callable[[BaseException], bool],
) -> T | None:
    """Connect, waiting out an unreachable server; None if a stop comes first.

    An error that is not about reaching the server (a refused password, say)
    is raised: waiting would not fix it.
    """
    backoff = Backoff(initial=0.5, maximum=5.0)
    while not stop.is_set():
        attempt = asyncio.create_task(connect())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await attempt
            return None
        exc = attempt.exception()
        if exc is None:
            return attempt.result()
        if not transient(exc):
            raise exc
        delay = backoff.next_delay()
        log.warning(
            f"{what} unreachable; waiting for it",
            error=redact(repr(exc))[:300],
            retry_in_s=round(delay, 3),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return None


async def release_within(
    compensator: asyncio.Task[None],
    inbox: asyncio.Queue[tuple[ClaimedRun, ...] | None],
    seconds: float,
) -> None:
    """The compensator's last releases, while the database takes them within ``seconds``.

    It retries an outage for as long as it lasts; at a stop, the runs it could
    not hand back in time are left to their claim leases instead.
    """
    try:
        async with asyncio.timeout(seconds):
            await inbox.put(None)
            await compensator  # cancelled with this wait when the time is up
    except TimeoutError:
        log.warning(
            "stopping: unpublished runs not all released in time; their claim "
            "leases bring them back",
            waited_s=seconds,
        )


async def cancel_within(task: asyncio.Task[None], seconds: float) -> None:
    """Cancel ``task`` and wait for it at most ``seconds``, cancelling again halfway.

    A cancelled task may go on waiting in its cleanup (a pool close on a silent
    connection, say) until cancelled once more. Still not done after that, it
    is left: the replica returns, and the exit watchdog ends the process.
    """
    task.cancel()
    _, pending = await asyncio.wait({task}, timeout=seconds / 2)
    if pending:
        task.cancel()
        _, pending = await asyncio.wait({task}, timeout=seconds / 2)
    if pending:
        log.error(
            "stop still waiting after cancelling; leaving it", waited_s=STOP_MARGIN_S + seconds
        )


_watchdog: threading.Timer | None = None


def arm_exit_watchdog(seconds: float) -> None:
    """End the process ``seconds`` from now unless it has ended by then (once per process).

    A daemon thread: it does not keep a process that ends in time alive, and
    it fires even while the event loop is stuck.
    """
    global _watchdog
    if _watchdog is not None:
        return

    def exit_now() -> None:
        log.error(
            "stop exceeded its bound; exiting now (leases recover the runs left)", bound_s=seconds
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(FORCED_EXIT_CODE)

    _watchdog = threading.Timer(seconds, exit_now)
    _watchdog.daemon = True
    _watchdog.start()

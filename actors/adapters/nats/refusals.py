"""Publishes JetStream refused: told apart from unanswered ones, and reported as such.

A full stream (``max_msgs`` / ``max_bytes`` with ``discard = new``) answers each
publish at once with an error while it still answers pings. nats-py 2.16 loses
that answer for ``publish_async``: its reply handler calls
``APIError.from_error``, which *raises* the error instead of returning it, so
the publish's future is never resolved and every refused publish looked like
one that timed out (the whole publish timeout, and "unreachable" in the logs).
:func:`answer_refusals` puts the refusal on the future, where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from actors.adapters.nats.connection import NATS_HEALTH


def answer_refusals(js: JetStreamContext) -> None:
    """Wrap ``js``'s async-publish reply handler so that an error answer fails the future.

    Must run before the first ``publish_async``: that is when nats-py subscribes
    the handler (read from the instance, so this one is taken). A JetStream
    context without nats-py's private handler (another version, a test's
    stand-in) is left as it is: its refusals then look like timeouts, as before.
    """
    handle = getattr(js, "_handle_async_reply", None)
    if handle is None or not hasattr(js, "_publish_async_futures"):
        return

    async def handle_refusals(msg: Msg) -> None:
        try:
            await handle(msg)
        except APIError as exc:
            # The same token nats-py reads (inbox prefix, 22-char nuid, two dots).
            token = msg.subject[len(js._nc._inbox_prefix) + 22 + 2 :]
            future = js._publish_async_futures.get(token)
            if future is not None and not future.done():
                future.set_exception(exc)

    js._handle_async_reply = handle_refusals  # type: ignore[method-assign]


def is_refusal(error: BaseException) -> bool:
    """An answer from JetStream that says no (not a missing stream: that one we recreate)."""
    return isinstance(error, APIError) and not isinstance(
        error, NotFoundError | NoStreamResponseError
    )


def report_publishes(results: Sequence[BaseException | None]) -> None:
    """NATS's health after a batch: accepted publishes end an outage, refusals begin one.

    Only a batch none of whose publishes was accepted is a refusal: one message
    refused among accepted ones is about that message. Timeouts say nothing
    here; the connection's own events and pings decide reachability.
    """
    if any(r is None for r in results):
        NATS_HEALTH.wrote()
        return
    refusal = next((r for r in results if r is not None and is_refusal(r)), None)
    if refusal is not None:
        description = getattr(refusal, "description", None) or repr(refusal)
        NATS_HEALTH.refused(f"publish: {description}")


__all__ = ["answer_refusals", "is_refusal", "report_publishes"]

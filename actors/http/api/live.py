"""GET /api/runs/{run_id}/output/stream: a run's output as it is printed (Server-Sent Events).

The answer first sends what is known so far (a finished attempt's kept tail, the
running attempt's tail from the replica running it), then each chunk as the
executing replica publishes it (actors.ports.live_output), then ``end`` once the
run is terminal in the database. Events, each one JSON line of ``data``:

- ``output``: ``{"attempt": n, "text": "..."}``, in order;
- ``notice``: ``{"text": "..."}`` (chunks this follower missed, the stream's time limit);
- ``end``: ``{"state": "...", "outcome": "..."}``; the server closes the stream after it.

Streams are bounded apart from the connection cap (MAX_STREAMS, at most a quarter
of it): one more is answered 503, so followers can never hold every connection.
Each lasts MAX_STREAM_S at most (a browser's EventSource reconnects by itself), sends
a comment every KEEPALIVE_S (proxies keep it open), and ends when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web

from actors.domain import RunState
from actors.http.api.reading import path_of
from actors.http.openapi import requests as rq
from actors.observability import HTTP_REFUSED, get_logger
from actors.observability.metrics import OUTPUT_STREAMS
from actors.operator import OperatorService, Unavailable
from actors.ports import OutputChunk, OutputFeed, OutputFollow

log = get_logger("api")

MAX_STREAMS = 64
MAX_STREAM_S = 3600.0
KEEPALIVE_S = 15.0
# How often the run's state is read while no chunk says its attempt ended.
STATE_POLL_S = 2.0
# After an attempt's end: how often, until the verdict is recorded.
AFTER_END_POLL_S = 0.2
AFTER_END_FAST_S = 10.0
SNAPSHOT_TIMEOUT_S = 0.5
# How long the end waits for the last chunks of an attempt followed live.
END_WAIT_S = 1.0


def _event(name: str, data: dict[str, Any]) -> bytes:
    # JSON keeps a chunk's newlines inside one data line.
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class OutputStreams:
    """The route's handler and the streams open now (bounded, closed at shutdown)."""

    def __init__(self, api: Any) -> None:
        # The OperatorApi: its service, feed and bound (max_output_streams) are set by
        # the replica, and change as the servers come and go.
        self.api = api
        self.open = 0
        self.stopping = asyncio.Event()

    async def close(self, _: web.Application) -> None:
        """``on_shutdown``: every stream ends now (the stop does not wait out followers)."""
        self.stopping.set()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        run_id = str(path_of(request, rq.RunPath).run_id)
        service: OperatorService = self.api.service
        run = _plain(await service.run(run_id))  # 404 before anything is streamed
        if self.open >= self.api.max_output_streams:
            HTTP_REFUSED.labels(reason="output_streams").inc()
            raise Unavailable(
                f"{self.open} output streams are open on this replica (the most it serves); "
                "try again, or read the kept tail (GET /api/runs/{run_id})"
            )
        self.open += 1
        OUTPUT_STREAMS.inc()
        try:
            return await self._serve(request, run_id, run)
        finally:
            self.open -= 1
            OUTPUT_STREAMS.dec()

    async def _serve(
        self, request: web.Request, run_id: str, run: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a proxy that buffers would hold the lines
            }
        )
        await response.prepare(request)
        feed: OutputFeed | None = getattr(self.api, "output_feed", None)
        try:
            if feed is None:
                await self._kept(response, run, None)
                await self._until_end(response, run_id, None)
            else:
                async with feed.follow(run_id) as follow:
                    await self._follow(response, run_id, run, follow)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - the stream has begun: say it, then close
            log.warning("output stream ended by an error", run_id=run_id, error=repr(exc))
            await _send(response, "notice", {"text": f"stream ended: {type(exc).__name__}"})
        return response

    async def _follow(
        self,
        response: web.StreamResponse,
        run_id: str,
        run: dict[str, Any],
        follow: OutputFollow,
    ) -> None:
        snapshot = None if _terminal(run) else await follow.snapshot(SNAPSHOT_TIMEOUT_S)
        await self._kept(response, run, snapshot)
        await self._until_end(response, run_id, follow, snapshot)

    async def _kept(
        self, response: web.StreamResponse, run: dict[str, Any], snapshot: OutputChunk | None
    ) -> None:
        """The kept tail of each recorded attempt, then the running one's tail so far."""
        for attempt in run.get("attempts", []):
            if attempt.get("output_tail") and (
                snapshot is None or attempt["attempt"] != snapshot.attempt
            ):
                await _send(
                    response,
                    "output",
                    {"attempt": attempt["attempt"], "text": attempt["output_tail"]},
                )
        if snapshot is not None and snapshot.text:
            await _send(response, "output", {"attempt": snapshot.attempt, "text": snapshot.text})

    async def _until_end(
        self,
        response: web.StreamResponse,
        run_id: str,
        follow: OutputFollow | None,
        snapshot: OutputChunk | None = None,
    ) -> None:
        started = last_sent = next_poll = time.monotonic()  # the state read at once
        fast_until = 0.0
        seen: dict[int, int] = {} if snapshot is None else {snapshot.attempt: snapshot.seq}
        ended: set[int] = set()  # attempts whose end chunk was heard
        while not self.stopping.is_set():
            now = time.monotonic()
            if now - started >= MAX_STREAM_S:
                await _send(response, "notice", {"text": "stream time limit; reconnect"})
                return
            if now >= next_poll:
                try:  # the replica's service now (its database may have gone, or it stops)
                    run = _plain(await self.api.service.run(run_id))
                except Unavailable:
                    text = "this replica is stopping or lost its database; reconnect to follow on"
                    await _send(response, "notice", {"text": text})
                    return
                if _terminal(run):
                    attempt = run.get("attempt")
                    live = attempt in seen and attempt not in ended
                    await self._drain(response, follow, seen, attempt if live else None)
                    end = {"state": run["state"], "outcome": run.get("outcome")}
                    await _send(response, "end", end)
                    return
                fast = time.monotonic() < fast_until
                next_poll = time.monotonic() + (AFTER_END_POLL_S if fast else STATE_POLL_S)
            wait = max(0.0, min(next_poll - time.monotonic(), 1.0))
            if follow is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
                chunk = None
            else:
                chunk = await follow.next(wait)
            if chunk is not None:
                if chunk.end:  # the verdict is recorded soon: read the state often a while
                    ended.add(chunk.attempt)
                    fast_until = time.monotonic() + AFTER_END_FAST_S
                    next_poll = min(next_poll, time.monotonic() + AFTER_END_POLL_S)
                if await _relay(response, chunk, seen):
                    last_sent = time.monotonic()
            if time.monotonic() - last_sent >= KEEPALIVE_S:
                await response.write(b": keepalive\n\n")
                last_sent = time.monotonic()
        await _send(
            response, "notice", {"text": "this replica is stopping; reconnect to follow on"}
        )

    async def _drain(
        self,
        response: web.StreamResponse,
        follow: OutputFollow | None,
        seen: dict[int, int],
        attempt: int | None,
    ) -> None:
        """What was heard before the end was read, sent in order; and for ``attempt``
        (followed live, its end not heard yet) its last chunks, up to END_WAIT_S: published
        before its verdict was recorded, they may still arrive after it was read."""
        deadline = time.monotonic() + END_WAIT_S
        waiting = attempt is not None
        while follow is not None:
            wait = max(0.0, deadline - time.monotonic()) if waiting else 0.0
            chunk = await follow.next(wait)
            if chunk is None:
                return
            await _relay(response, chunk, seen)
            if chunk.end and chunk.attempt == attempt:
                waiting = False


async def _relay(response: web.StreamResponse, chunk: OutputChunk, seen: dict[int, int]) -> bool:
    """Send ``chunk`` unless the snapshot already held it; a gap is said."""
    last = seen.get(chunk.attempt, 0)
    if chunk.seq <= last:
        return False
    if last and chunk.seq > last + 1:
        await _send(response, "notice", {"text": f"{chunk.seq - last - 1} chunk(s) missed"})
    seen[chunk.attempt] = chunk.seq
    if not chunk.text:
        return False
    await _send(response, "output", {"attempt": chunk.attempt, "text": chunk.text})
    return True


async def _send(response: web.StreamResponse, name: str, data: dict[str, Any]) -> None:
    await response.write(_event(name, data))


def _plain(run: Any) -> dict[str, Any]:
    """The run's read model as JSON values (what the events carry)."""
    found: dict[str, Any] = run.model_dump(mode="json") if hasattr(run, "model_dump") else run
    return found


def _terminal(run: dict[str, Any]) -> bool:
    return RunState(run["state"]).terminal


def add_output_stream(app: web.Application, api: Any, path: str) -> None:
    """The route at ``path`` (from the route table), its streams closed at shutdown."""
    streams = OutputStreams(api)
    app.router.add_get(path, streams.stream, allow_head=False)
    app.on_shutdown.append(streams.close)

"""GET /api/runs/{run_id}/output/stream on the in-memory operator store and a fake feed:
what the stream sends, in which order, and its bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY

from actors.domain import ExecutionResult, Outcome
from actors.http.api import OperatorApi
from actors.http.server import build_app
from actors.operator import OperatorService
from actors.ports import Completion, OutputChunk
from actors.testing.memory import InMemoryRunStore, ManualClock
from actors.testing.memory_operator import InMemoryOperatorStore
from tests.contract.jobs import LEASE, job, message

READ_TOKEN = "a-read-token-0123456789"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
Client = TestClient[web.Request, web.Application]


class FakeFeed:
    """The OutputFeed port: a snapshot, then the chunks the test puts."""

    def __init__(self) -> None:
        self.snap: OutputChunk | None = None
        self.chunks: asyncio.Queue[OutputChunk] = asyncio.Queue()
        self.following = 0
        # Called when the snapshot is asked (the run may end then); chunks that arrive
        # only once the stream waits for them (late on the network).
        self.on_snapshot: Callable[[], Awaitable[None]] | None = None
        self.late: list[OutputChunk] = []

    @asynccontextmanager
    async def follow(self, run_id: str) -> AsyncIterator[FakeFeed]:
        self.following += 1
        try:
            yield self
        finally:
            self.following -= 1

    async def snapshot(self, timeout: float) -> OutputChunk | None:
        if self.on_snapshot is not None:
            await self.on_snapshot()
        return self.snap

    async def next(self, timeout: float) -> OutputChunk | None:
        if timeout > 0 and self.chunks.empty():
            for chunk in self.late:
                self.chunks.put_nowait(chunk)
            self.late = []
        try:
            return await asyncio.wait_for(self.chunks.get(), timeout)
        except TimeoutError:
            return None


async def _events(response: ClientResponse) -> list[tuple[str, dict[str, object]]]:
    text = await response.text()
    events = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


@asynccontextmanager
async def _world() -> AsyncIterator[tuple[Client, InMemoryRunStore, FakeFeed, OperatorApi, list]]:
    clock = ManualClock()
    store = InMemoryRunStore(clock)
    await store.sync_jobs([job("job")])
    now = clock.now()
    store.add_run("job", now - timedelta(minutes=20))
    store.add_run("job", now - timedelta(minutes=10))
    first, second = await store.claim_due_runs("c", 2, LEASE, 100)
    await store.start_runs("w", [message(first), message(second)], LEASE)
    done = ExecutionResult(Outcome.FAILED, error="boom", exit_code=1, output_tail="kept\n")
    await store.complete_runs([Completion(first.run_id, first.epoch, done, None, "w")])
    api = OperatorApi(
        OperatorService(InMemoryOperatorStore(store)), [("viewer", READ_TOKEN, "read")]
    )
    feed = FakeFeed()
    api.output_feed = feed

    async def ready() -> dict[str, str]:
        return {"postgres": "ok", "nats": "ok"}

    async with TestClient(TestServer(build_app(ready, api))) as client:
        yield client, store, feed, api, [first, second]


async def test_a_finished_run_streams_its_kept_tail_then_its_end() -> None:
    async with _world() as (client, _, _, _, (first, _)):
        path = f"/api/runs/{first.run_id}/output/stream"
        async with client.get(path, headers=READ) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert await _events(r) == [
                ("output", {"attempt": 1, "text": "kept\n"}),
                ("end", {"state": "failed", "outcome": "failed"}),
            ]


async def test_a_running_run_streams_its_tail_so_far_then_live_chunks_then_its_end() -> None:
    async with _world() as (client, store, feed, _, (_, second)):
        feed.snap = OutputChunk(attempt=1, seq=2, text="a\nb\n")
        # Chunk 2 was in the snapshot already; 3 is new.
        feed.chunks.put_nowait(OutputChunk(attempt=1, seq=2, text="b\n"))
        feed.chunks.put_nowait(OutputChunk(attempt=1, seq=3, text="c\n"))
        feed.chunks.put_nowait(OutputChunk(attempt=1, seq=4, end=True))

        async def finish() -> None:
            while feed.chunks.qsize():  # the stream has read every chunk
                await asyncio.sleep(0.01)
            ok = ExecutionResult(Outcome.SUCCEEDED, exit_code=0, output_tail="a\nb\nc\n")
            await store.complete_runs([Completion(second.run_id, second.epoch, ok, None, "w")])

        finishing = asyncio.create_task(finish())
        async with client.get(f"/api/runs/{second.run_id}/output/stream", headers=READ) as r:
            events = await _events(r)
        await finishing
        assert events == [
            ("output", {"attempt": 1, "text": "a\nb\n"}),
            ("output", {"attempt": 1, "text": "c\n"}),
            ("end", {"state": "succeeded", "outcome": "succeeded"}),
        ]
        assert feed.following == 0  # unsubscribed once the stream ended


async def test_the_last_chunks_arriving_after_the_verdict_are_still_sent() -> None:
    """The executing replica publishes its last chunk and the attempt's end, then records
    the verdict; the stream may read the verdict first: it waits (a bounded while) for
    the end of the attempt it followed, and sends what comes before it."""
    async with _world() as (client, store, feed, _, (_, second)):
        feed.snap = OutputChunk(attempt=1, seq=1, text="first\n")

        async def verdict_first() -> None:
            ok = ExecutionResult(Outcome.SUCCEEDED, exit_code=0, output_tail="first\nlast\n")
            await store.complete_runs([Completion(second.run_id, second.epoch, ok, None, "w")])

        feed.on_snapshot = verdict_first
        feed.late = [
            OutputChunk(attempt=1, seq=2, text="last\n"),
            OutputChunk(attempt=1, seq=3, end=True),
        ]
        async with client.get(f"/api/runs/{second.run_id}/output/stream", headers=READ) as r:
            events = await _events(r)
        assert events == [
            ("output", {"attempt": 1, "text": "first\n"}),
            ("output", {"attempt": 1, "text": "last\n"}),
            ("end", {"state": "succeeded", "outcome": "succeeded"}),
        ]


async def test_the_stream_needs_a_read_token_a_known_run_and_a_free_place() -> None:
    async with _world() as (client, _, _, api, (first, _)):
        path = f"/api/runs/{first.run_id}/output/stream"
        async with client.get(path) as r:
            assert r.status == 401
        unknown = "/api/runs/00000000-0000-4000-8000-000000000000/output/stream"
        async with client.get(unknown, headers=READ) as r:
            assert r.status == 404
        api.max_output_streams = 0  # every place taken
        refused = {"reason": "output_streams"}
        before = REGISTRY.get_sample_value("claimd_http_refused_total", refused) or 0
        async with client.get(path, headers=READ) as r:
            assert r.status == 503
            assert "output streams are open" in (await r.json())["error"]
        assert REGISTRY.get_sample_value("claimd_http_refused_total", refused) == before + 1

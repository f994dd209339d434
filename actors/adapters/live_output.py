"""Live output on NATS core subjects: what a running attempt prints, relayed as it is read.

The replica executing a run publishes its output on ``<prefix>.output.<run_id>``
every FLUSH_S, at most ``rate`` bytes per second per run: past the bound the
bytes are counted, not kept, and a "[claimd: N bytes dropped ...]" line says so,
so a job that floods costs the replica a bounded buffer and a bounded publish
rate whatever it prints. The same replica answers ``<prefix>.output-tail.<run_id>``
with what it relayed so far (the last OUTPUT_TAIL_BYTES), so a follower that
arrives late starts with the tail. Nothing is stored; the tail recorded with
each attempt stays what it was. Core NATS (no JetStream): a follower that is not
subscribed misses what was published meanwhile, by design.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from actors.adapters.executors.common import OUTPUT_SINK, OUTPUT_TAIL_BYTES
from actors.domain import ExecutionResult, ExecutorSpec, RunContext
from actors.observability import get_logger
from actors.observability.metrics import LIVE_OUTPUT_DROPPED
from actors.observability.secrets import MASKER
from actors.ports import Executor, OutputChunk

log = get_logger("live-output")

# Bytes relayed per second per run; the rest is dropped (and said).
LIVE_OUTPUT_RATE = 64 * 1024
FLUSH_S = 0.1
# A line longer than this is published in pieces (else it waits for its newline).
MAX_LINE = 8 * 1024
# Chunks a follower holds before it drops (a slow HTTP client costs this at most).
FOLLOWER_QUEUE = 256


class _AttemptOutput:
    """One attempt's output waiting to be published: at most ``rate`` bytes a second.

    ``add`` is the executors' sink (actors.adapters.executors.common.OUTPUT_SINK),
    called from the pump or from an async job's loop thread: it only appends under
    a lock, or counts what the bound cuts.
    """

    def __init__(self, attempt: int, rate: int) -> None:
        self.attempt = attempt
        self.rate = rate
        self.seq = 0
        self.tail = ""
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._dropped = 0
        self._window = time.monotonic()
        self._used = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._carry = ""

    def add(self, chunk: bytes) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._window >= 1.0:
                self._window, self._used = now, 0
            room = max(0, self.rate - self._used)
            kept = chunk if len(chunk) <= room else chunk[:room]
            self._pending += kept
            self._used += len(kept)
            self._dropped += len(chunk) - len(kept)

    def take(self, final: bool = False) -> str:
        """The text to publish now: whole lines (a secret is masked within its line),
        a long line in pieces, everything at the end; and the drop marker."""
        with self._lock:
            data, dropped = bytes(self._pending), self._dropped
            self._pending.clear()
            self._dropped = 0
        text = self._carry + self._decoder.decode(data, final=final)
        cut = len(text) if final or len(text) > MAX_LINE else text.rfind("\n") + 1
        out, self._carry = text[:cut], text[cut:]
        if dropped:
            LIVE_OUTPUT_DROPPED.inc(dropped)
            out += f"\n[claimd: {dropped} bytes dropped: live output is relayed at most "
            out += f"{self.rate} bytes/s per run; the attempt's kept tail is unaffected]\n"
            # What follows the marker starts a line of its own.
            self._carry = ""
        return MASKER.mask(out)

    def published(self, text: str) -> None:
        self.seq += 1
        self.tail = (self.tail + text)[-OUTPUT_TAIL_BYTES:]


def _encode(chunk: OutputChunk) -> bytes:
    return json.dumps(
        {"attempt": chunk.attempt, "seq": chunk.seq, "text": chunk.text, "end": chunk.end}
    ).encode()


def _decode(data: bytes) -> OutputChunk | None:
    try:
        body = json.loads(data)
        return OutputChunk(
            attempt=int(body["attempt"]),
            seq=int(body["seq"]),
            text=str(body.get("text", "")),
            end=bool(body.get("end", False)),
        )
    except (ValueError, KeyError, TypeError):
        return None


class OutputRelay:
    """This replica's side of live output: publishes its runs', and follows any run's.

    ``prefix``: the deployment's subject prefix (``claimd.<deployment>``), so that
    deployments (and tests) sharing one NATS do not hear each other. Without a
    connection (before NATS is reached) nothing is published and nothing followed.
    """

    def __init__(self, prefix: str, rate: int = LIVE_OUTPUT_RATE) -> None:
        self.prefix = prefix
        self.rate = rate
        self.nc: NATS | None = None
        self._running: dict[str, _AttemptOutput] = {}
        self._tail_sub: Any = None

    def subject(self, run_id: str) -> str:
        return f"{self.prefix}.output.{run_id}"

    def tail_subject(self, run_id: str) -> str:
        return f"{self.prefix}.output-tail.{run_id}"

    async def attach(self, nc: NATS) -> None:
        """Publish on ``nc`` from now on, and answer tail requests for the runs running here."""
        self.nc = nc
        self._tail_sub = await nc.subscribe(self.tail_subject("*"), cb=self._answer_tail)

    async def detach(self) -> None:
        sub, self._tail_sub, self.nc = self._tail_sub, None, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _answer_tail(self, msg: Msg) -> None:
        running = self._running.get(msg.subject.rsplit(".", 1)[-1])
        if running is None or not msg.reply:
            return  # not running here: another replica answers, or nobody
        snapshot = OutputChunk(running.attempt, running.seq, running.tail)
        with contextlib.suppress(Exception):
            await msg.respond(_encode(snapshot))

    async def _publish(self, run_id: str, chunk: OutputChunk) -> None:
        nc = self.nc
        if nc is None or not nc.is_connected:
            return  # nobody can hear it; the kept tail is recorded anyway
        try:
            await nc.publish(self.subject(run_id), _encode(chunk))
        except Exception as exc:  # noqa: BLE001 - a full client buffer: this chunk is lost
            log.debug("live output not published", run_id=run_id, error=repr(exc))

    async def _flush_loop(self, run_id: str, output: _AttemptOutput) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)  # a pace, not a synchronisation
            await self._flush(run_id, output)

    async def _flush(self, run_id: str, output: _AttemptOutput, final: bool = False) -> None:
        text = output.take(final)
        if text:
            output.published(text)
            await self._publish(run_id, OutputChunk(output.attempt, output.seq, text))

    async def _finish(self, run_id: str, output: _AttemptOutput) -> None:
        with contextlib.suppress(Exception):
            await self._flush(run_id, output, final=True)
            output.seq += 1
            await self._publish(run_id, OutputChunk(output.attempt, output.seq, end=True))

    @contextlib.asynccontextmanager
    async def relaying(self, context: RunContext) -> AsyncIterator[None]:
        """While inside, the attempt's output (every Tail an executor makes) is relayed."""
        run_id = context.run_id
        output = _AttemptOutput(context.attempt, self.rate)
        self._running[run_id] = output
        token = OUTPUT_SINK.set(output.add)
        flushing = asyncio.ensure_future(self._flush_loop(run_id, output))
        try:
            yield
        finally:
            OUTPUT_SINK.reset(token)
            flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flushing
            if self._running.get(run_id) is output:
                del self._running[run_id]
            # Shielded: a cancelled attempt (a lost lease, a stop) still says it ended.
            await asyncio.shield(self._finish(run_id, output))

    @contextlib.asynccontextmanager
    async def follow(self, run_id: str) -> AsyncIterator[_Follow]:
        """The OutputFeed port: subscribed to ``run_id``'s output while inside."""
        follower = _Follow(self, run_id)
        nc = self.nc
        if nc is not None:
            follower.sub = await nc.subscribe(self.subject(run_id), cb=follower.receive)
        try:
            yield follower
        finally:
            if follower.sub is not None:
                with contextlib.suppress(Exception):
                    await follower.sub.unsubscribe()


class _Follow:
    """One follower (OutputFollow port): a bounded queue of the chunks heard."""

    def __init__(self, relay: OutputRelay, run_id: str) -> None:
        self.relay = relay
        self.run_id = run_id
        self.sub: Any = None
        self.queue: asyncio.Queue[OutputChunk] = asyncio.Queue(FOLLOWER_QUEUE)
        self.lost = 0

    async def receive(self, msg: Msg) -> None:
        chunk = _decode(msg.data)
        if chunk is None:
            return
        try:
            self.queue.put_nowait(chunk)
        except asyncio.QueueFull:
            self.lost += 1  # a follower too slow to read: it skips, the replica does not wait

    async def snapshot(self, timeout: float) -> OutputChunk | None:
        nc = self.relay.nc
        if nc is None:
            return None
        try:
            answer = await nc.request(self.relay.tail_subject(self.run_id), b"", timeout=timeout)
        except Exception:  # noqa: BLE001 - no responder, a timeout: not running anywhere
            return None
        return _decode(answer.data)

    async def next(self, timeout: float) -> OutputChunk | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None


class LiveOutputExecutor:
    """An Executor whose attempts' output is relayed live (by ``relay``) as it runs."""

    def __init__(self, inner: Executor, relay: OutputRelay) -> None:
        self.inner = inner
        self.relay = relay

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        async with self.relay.relaying(context):
            return await self.inner.execute(spec, context, timeout)

    def runs_inline(self, executor: str | None) -> bool:
        return self.inner.runs_inline(executor)

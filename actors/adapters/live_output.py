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
from collections.abc import AsyncIterator, Callable
from contextvars import Token
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

    def __init__(self, attempt: int, rate: int, noted: Callable[[], None] = lambda: None) -> None:
        """``noted()``: called (from any thread) when output waits and was not waiting."""
        self.attempt = attempt
        self.rate = rate
        self.seq = 0
        self.tail = ""
        self.followed = False  # a follower asked for its tail: it is told of the end
        self._noted = noted
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._waiting = False  # output added since the last take (the relay was told)
        self._dropped = 0
        self._window = time.monotonic()
        self._used = 0
        self._decoder: codecs.IncrementalDecoder | None = None  # made at the first output
        self._carry = ""

    @property
    def printed(self) -> bool:
        """Whether anything was published, or waits to be."""
        return self.seq > 0 or self._waiting or bool(self._carry)

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
            first, self._waiting = not self._waiting, True
        if first:
            self._noted()

    def take(self, final: bool = False) -> str:
        """The text to publish now: whole lines (a secret is masked within its line),
        a long line in pieces, everything at the end; and the drop marker."""
        with self._lock:
            data, dropped = bytes(self._pending), self._dropped
            self._pending.clear()
            self._dropped = 0
            self._waiting = False
        if not data and not dropped and not self._carry:
            return ""
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
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
        # Runs whose output waits to be published: one flusher for all of them, every
        # FLUSH_S while runs are relayed (a task and a timer per run cost a herd of
        # 10,000 silent runs most of a replica's time at their instant).
        self._waiting: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None

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
        running.followed = True
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

    async def _flush_loop(self) -> None:
        """Publish what waits, every FLUSH_S, while any run is relayed here."""
        try:
            while self._running:
                await asyncio.sleep(FLUSH_S)  # a pace, not a synchronisation
                for run_id in list(self._waiting):
                    self._waiting.discard(run_id)
                    output = self._running.get(run_id)
                    if output is not None:
                        await self._flush(run_id, output)
        finally:
            self._flusher = None

    async def _flush(self, run_id: str, output: _AttemptOutput, final: bool = False) -> None:
        text = output.take(final)
        if text:
            output.published(text)
            await self._publish(run_id, OutputChunk(output.attempt, output.seq, text))

    async def _finish(self, run_id: str, output: _AttemptOutput) -> None:
        """The rest of the output, and the end, to followers: said only for an attempt
        that printed or was followed (a follower also reads the run's state)."""
        if not (output.printed or output.followed):
            return
        with contextlib.suppress(Exception):
            await self._flush(run_id, output, final=True)
            output.seq += 1
            await self._publish(run_id, OutputChunk(output.attempt, output.seq, end=True))

    def begin(self, context: RunContext) -> tuple[_AttemptOutput, Token[Any]]:
        """The attempt's output (every Tail an executor makes) is relayed from now on."""
        run_id = context.run_id
        waiting = self._waiting
        output = _AttemptOutput(context.attempt, self.rate, lambda: waiting.add(run_id))
        self._running[run_id] = output
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush_loop())
        return output, OUTPUT_SINK.set(output.add)

    async def end(self, context: RunContext, output: _AttemptOutput, token: Token[Any]) -> None:
        """The attempt ended: its output is relayed no more, the rest published."""
        run_id = context.run_id
        OUTPUT_SINK.reset(token)
        if self._running.get(run_id) is output:
            del self._running[run_id]
        self._waiting.discard(run_id)
        if not (output.printed or output.followed):
            return  # nothing to say (a task for nothing was most of a silent run's cost here)
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
        output, token = self.relay.begin(context)
        try:
            return await self.inner.execute(spec, context, timeout)
        finally:
            await self.relay.end(context, output, token)

    def runs_inline(self, executor: str | None) -> bool:
        return self.inner.runs_inline(executor)

    def prepare(self, executor: str | None, count: int = 1) -> None:
        """Passed on (Preparing): a sync python job's warm children are forked while its
        runs are held, not at their instant."""
        prepare = getattr(self.inner, "prepare", None)
        if prepare is not None:
            prepare(executor, count)

    async def close(self) -> None:
        """Passed on (Closing): the python fork server ends with the worker."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()

"""Async python jobs: in-process, on job event loops of their own, watched.

An ``async def`` job runs on the job event loop, on its own thread, never on
the worker's loop: a job that blocks (``time.sleep`` in an async def) holds
only the async jobs, while the worker's loop keeps starting runs and
heartbeating leases, and shell and sync python jobs run on. One job loop, not
several: async job code keeps module-level clients (an asyncpg pool, an
aiohttp session) made on the loop it first ran on, and such a client used from
a second loop fails or, in C extensions, crashes the replica (seen with four
loops in the fault harness: asyncpg "another operation is in progress" and
SIGSEGV). A watchdog thread notices a job loop
that has not come round for ``BLOCKED_AFTER`` seconds and names the job
holding it (a warning, and ``claimd_job_loop_blocked_seconds_total{job}``).

What a job prints (``sys.stdout``/``sys.stderr``) and logs (``logging``) while
it runs is routed by a context variable to that attempt's output tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TextIO

from actors.adapters.executors import log_context
from actors.adapters.executors.common import Tail
from actors.adapters.executors.handoff import Handoff
from actors.observability import JOB_LOOP_BLOCKED, get_logger

log = get_logger("executor")

JOB_LOOPS = 1  # see the module's docstring: async job code expects one loop
BLOCKED_AFTER = 1.0  # seconds a job loop may go without coming round
BEAT = 0.1
AVOID_AFTER = 0.3  # a loop this late is not given new runs
WATCH_EVERY = 0.25

_CAPTURE: contextvars.ContextVar[Tail | None] = contextvars.ContextVar(
    "claimd_job_output", default=None
)


class _RoutedStream:
    """sys.stdout / sys.stderr: a running job's writes go to its tail, the rest pass."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        tail = _CAPTURE.get()
        if tail is None:
            return self._inner.write(text)
        tail.add(text.encode("utf-8", "backslashreplace"))
        return len(text)

    def flush(self) -> None:
        if _CAPTURE.get() is None:
            self._inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CaptureHandler(logging.Handler):
    """A root handler: a running job's log records go to its tail too."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(log_context.FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        tail = _CAPTURE.get()
        if tail is not None:
            with contextlib.suppress(Exception):
                tail.add((self.format(record) + "\n").encode("utf-8", "backslashreplace"))


_HANDLER = _CaptureHandler()


def _route_output() -> None:
    """Install the routing (again, if someone replaced the streams or the root's handlers)."""
    if not isinstance(sys.stdout, _RoutedStream):
        sys.stdout = _RoutedStream(sys.stdout)
    if not isinstance(sys.stderr, _RoutedStream):
        sys.stderr = _RoutedStream(sys.stderr)
    log_context.install()
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)


class _JobLoop:
    """One event loop on a thread of its own, beating while it comes round."""

    def __init__(self, index: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.beat = time.monotonic()
        # task -> (job, run id): who holds the loop when it stops beating.
        self.jobs: dict[asyncio.Task[Any], tuple[str, str]] = {}
        self.blocked_since: float | None = None
        self.counted = 0.0
        self.handoff = Handoff(self.loop)  # runs handed to it, many per wake-up
        self.thread = threading.Thread(
            target=self._serve, name=f"claimd-job-loop-{index}", daemon=True
        )
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._beat)
        self.loop.run_forever()

    def _beat(self) -> None:
        self.beat = time.monotonic()
        self.loop.call_later(BEAT, self._beat)

    def holder(self) -> tuple[str, str] | None:
        """The job whose task is running on the loop now (read from the watchdog)."""
        task = asyncio.current_task(self.loop)
        return None if task is None else self.jobs.get(task)


class _Attempt:
    """One async attempt between the worker's loop and the job loop.

    Handed over in both directions through :class:`Handoff` (many per
    wake-up): ``start`` and ``cancel`` run on the job loop, ``settle`` on the
    worker's.
    """

    def __init__(
        self,
        job_loop: _JobLoop,
        replies: Handoff,
        make: Callable[[], Coroutine[Any, Any, Any]],
    ) -> None:
        self.job_loop = job_loop
        self.replies = replies
        self.make = make
        self.done: asyncio.Future[Any] = replies.loop.create_future()  # the job's result
        self.ended: asyncio.Future[None] = replies.loop.create_future()  # its task is over
        self.task: asyncio.Task[Any] | None = None
        self.cancelled = False

    def start(self) -> None:
        if self.cancelled:  # cancelled before it began
            self.replies.call(lambda: self.settle(None))
            return
        self.task = self.job_loop.loop.create_task(self.make())
        self.task.add_done_callback(lambda t: self.replies.call(lambda: self.settle(t)))

    def cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    def settle(self, task: asyncio.Task[Any] | None) -> None:
        if not self.ended.done():
            self.ended.set_result(None)
        if self.done.done():
            return  # the worker stopped waiting (a timeout, a cancellation)
        if task is None or task.cancelled():
            self.done.cancel()
        elif (exc := task.exception()) is not None:
            self.done.set_exception(exc)
        else:
            self.done.set_result(task.result())


class JobLoops:
    """The job event loops and their watchdog, started at the first async job."""

    def __init__(self, count: int = JOB_LOOPS, blocked_after: float = BLOCKED_AFTER) -> None:
        self.count = count
        self.blocked_after = blocked_after
        self._loops: list[_JobLoop] = []
        self._lock = threading.Lock()
        self._back: dict[asyncio.AbstractEventLoop, Handoff] = {}

    def _started(self) -> list[_JobLoop]:
        with self._lock:
            if not self._loops:
                self._loops = [_JobLoop(i) for i in range(self.count)]
                watchdog = threading.Thread(
                    target=self._watch, name="claimd-job-watchdog", daemon=True
                )
                watchdog.start()
            return self._loops

    def loop_for(self, job: str) -> _JobLoop:
        """The job's own loop (by its name), unless that loop has stopped coming round.

        A run is not placed on a loop a job is blocking: it goes to the loop
        that came round last. What already waits on the blocked loop waits.
        """
        loops = self._started()
        chosen = loops[zlib.crc32(job.encode()) % len(loops)]
        if time.monotonic() - chosen.beat > AVOID_AFTER:
            chosen = max(loops, key=lambda candidate: candidate.beat)
        return chosen

    async def run(
        self,
        job: str,
        run_id: str,
        call: Callable[[], Awaitable[Any]],
        tail: Tail,
        timeout: float,
        grace: float,
    ) -> None:
        """Await ``call()`` on the job's loop, its output into ``tail``.

        At the timeout (or a cancellation) the job's task is cancelled and its
        end awaited (up to ``grace``): the attempt after this one does not
        start while this one still runs, unless the job refuses to end.
        Raises TimeoutError at the timeout and the job's own exception.
        """
        _route_output()
        job_loop = self.loop_for(job)

        async def wrapped() -> Any:
            _CAPTURE.set(tail)
            log_context.RUN.set((job, run_id))
            task = asyncio.current_task()
            assert task is not None
            job_loop.jobs[task] = (job, run_id)
            try:
                return await call()
            finally:
                job_loop.jobs.pop(task, None)

        attempt = _Attempt(job_loop, self._replies(asyncio.get_running_loop()), wrapped)
        job_loop.handoff.call(attempt.start)
        try:
            async with asyncio.timeout(timeout):
                await attempt.done
        except BaseException:
            job_loop.handoff.call(attempt.cancel)
            try:
                await asyncio.wait_for(asyncio.shield(attempt.ended), grace)
            except TimeoutError:
                log.warning(
                    "async python job did not end when cancelled",
                    job=job,
                    run_id=run_id,
                    grace_s=grace,
                )
            raise

    def _replies(self, loop: asyncio.AbstractEventLoop) -> Handoff:
        """The hand-off of jobs' ends back to ``loop`` (the worker's), one per loop."""
        found = self._back.get(loop)
        if found is None:
            if len(self._back) > 16:  # loops of tests come and go
                self._back = {k: v for k, v in self._back.items() if not k.is_closed()}
            found = self._back[loop] = Handoff(loop)
        return found

    def _watch(self) -> None:
        """The watchdog: names the job holding a loop that stopped coming round."""
        while True:
            time.sleep(WATCH_EVERY)
            now = time.monotonic()
            for job_loop in self._loops:
                self._check(job_loop, now)

    def _check(self, job_loop: _JobLoop, now: float) -> None:
        lag = now - job_loop.beat
        if lag < self.blocked_after:
            if job_loop.blocked_since is not None:
                log.info(
                    "job event loop free again",
                    loop=job_loop.thread.name,
                    blocked_s=round(now - job_loop.blocked_since, 3),
                )
                job_loop.blocked_since = None
            return
        holder = job_loop.holder()
        job, run_id = holder if holder is not None else ("", "")
        if job_loop.blocked_since is None:
            job_loop.blocked_since = job_loop.beat
            job_loop.counted = 0.0
            log.warning(
                "job event loop blocked by an async python job that does not yield",
                job=job or None,
                run_id=run_id or None,
                loop=job_loop.thread.name,
                blocked_s=round(lag, 3),
            )
        if job:
            JOB_LOOP_BLOCKED.labels(job).inc(lag - job_loop.counted)
        job_loop.counted = lag

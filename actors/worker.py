"""The worker: pull -> start -> execute -> complete -> ack.

Order is the guarantee. The run is recorded (complete, committed) before the
message is acked: a crash between the two means a redelivery, and the
redelivered message finds the run terminal and changes nothing. Acking first
would lose the run if the process died before recording it.

Starts and completions of concurrent runs are batched into one statement each;
every message is acked only after the statement that recorded its run has
committed.

A worker takes in only what it can keep. While its lease extensions, its
completions or its starts fail or hang (the database is away, or its
connection went silent), it fetches nothing: a run started then would finish
with nobody able to record it or extend its lease, and would be executed again
elsewhere after the lease. The runs it holds are left to their leases; the
other replicas take the new ones. Likewise an empty fetch is ambiguous (no
messages, or a dead connection): after a few in a row the worker pings the
broker, and while that goes unanswered it waits for the connection to come
back and then binds its subscription anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from actors.domain import AttemptVerdict, ExecutionResult, Outcome, RunState, decide_attempt
from actors.flow import Backoff, Probe, wait_for_stop
from actors.heartbeat import COMPLETIONS, STARTS, Heartbeat, InFlight, Keeping, Settle
from actors.observability import (
    COMPLETIONS_REJECTED,
    DELIVERIES_SKIPPED,
    FENCED_COMPLETIONS,
    INTAKE_PAUSED,
    INTAKE_PAUSES,
    POISON_MESSAGES,
    REDELIVERIES,
    RUN_DURATION,
    RUNS_COMPLETED,
    RUNS_FAILED_FINALLY,
    RUNS_IN_FLIGHT,
    RUNS_STARTED,
    SCHEDULE_LAG,
    get_logger,
)
from actors.ports import (
    Clock,
    Completion,
    DispatchMessage,
    Executor,
    Outage,
    RecordRejected,
    RunStore,
    StartedRun,
)

log = get_logger("worker")
COMPLETION_BATCH = 256
RESUBSCRIBE_AFTER = 3  # consecutive failed fetches; as many empty ones and the broker is pinged
FETCH_TIMEOUT_S = 1.0
RECORD_AT_STOP_S = 5.0  # at most this past the grace for the last verdicts (less on short leases)
BROKER_PROBE_TIMEOUT_S = 2.0  # a ping's round trip; capped by the stall threshold
START_UNKNOWN_KEPT = 10_000  # (run, epoch) keys whose start reply was lost, remembered


class Delivery(Protocol):
    """A JetStream message as the worker uses it."""

    data: bytes

    async def ack(self) -> None: ...
    async def term(self) -> None: ...
    async def nak(self, delay: float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


class Subscription(Protocol):
    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Any]: ...


@dataclass
class _Pending:
    completion: Completion
    delivery: Settle
    job: str


@dataclass
class WorkerFaults:
    """Test-only faults, from the environment (the chaos harness and e2e tests set them)."""

    exit_after_complete: int = 0  # exit the process after the Nth recorded batch, before acking

    @classmethod
    def from_env(cls) -> WorkerFaults:
        return cls(int(os.environ.get("CLAIMD_FAULT_EXIT_AFTER_COMPLETE", "0") or 0))


class Worker:
    """Executes dispatched runs with at most ``concurrency`` at a time."""

    def __init__(
        self,
        store: RunStore,
        subscription: Subscription,
        executor: Executor,
        *,
        worker_id: str,
        deployment: str,
        lease: timedelta,
        heartbeat_interval: timedelta,
        concurrency: int,
        decode: Callable[[bytes, str], DispatchMessage],
        delivery_count: Callable[[Any], int],
        stop: asyncio.Event,
        grace: timedelta,
        faults: WorkerFaults | None = None,
        after_record: Callable[[list[_Pending]], None] | None = None,
        resubscribe: Callable[[], Awaitable[Subscription]] | None = None,
        clock: Clock | None = None,
        probe_broker: Callable[[], Awaitable[object]] | None = None,
        stall_after: timedelta | None = None,
    ) -> None:
        self.store = store
        # Lag is measured on the database's clock (estimated locally), not the host's.
        self.clock = clock
        self.sub = subscription
        self.executor = executor
        self.worker_id = worker_id
        self.deployment = deployment
        self.lease = lease
        self.concurrency = concurrency
        self.decode = decode
        self.delivery_count = delivery_count
        self.stop = stop
        self.grace = grace
        self.faults = faults or WorkerFaults.from_env()
        self.after_record = after_record
        self.resubscribe = resubscribe
        self.in_flight: dict[tuple[str, int], InFlight] = {}
        # Attempts whose start may have committed without the reply reaching us
        # (start_runs raised or was cancelled): never begun here, so their redelivery may take up
        # again a run left `running` under this worker and epoch. Nothing else
        # may: an attempt this worker began (and whose actor then crashed, or
        # whose completion could not be recorded) is left to its lease, never
        # run twice under one fencing token. Kept across restarts of the actor
        # (the supervisor reruns this object, with the same worker id).
        self._start_unknown: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.completions: asyncio.Queue[_Pending | None] = asyncio.Queue(maxsize=concurrency * 2)
        self._slot_freed = asyncio.Event()
        self._recorded_batches = 0
        self._hb_stop = asyncio.Event()
        # A database call unanswered for a quarter of the lease is failing: the
        # leases it would extend are running out (the lease's own deadlines,
        # statement and acquire, fit inside this).
        self.keeping = Keeping(stall_after or max(lease / 4, timedelta(seconds=1)))
        self.heartbeat = Heartbeat(
            lambda runs: self.store.extend_leases(self.worker_id, runs, self.lease),
            self.in_flight,
            heartbeat_interval,
            self._hb_stop,
            outage=Outage,
            keeping=self.keeping,
        )
        stall = self.keeping.stall_after
        self._store_probe = Probe(lambda: self.store.ping(), stall)
        self._broker_probe = (
            Probe(probe_broker, min(BROKER_PROBE_TIMEOUT_S, stall))
            if probe_broker is not None
            else None
        )
        self._fetch_backoff = Backoff(initial=0.2, maximum=5.0)
        self._empty_fetches = 0

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch, start, execute, record, ack until ``stop``; then drain within the grace."""
        try:
            await self._run()
        except BaseException:
            self._after_crash()
            raise

    def _after_crash(self) -> None:
        """Forget the runs a crashed loop can no longer finish, so nothing keeps them alive.

        The supervisor reruns this same worker. Its executions were cancelled
        (one cancelled before it began never cleaned up after itself) and the
        batch being recorded was dropped: those runs leave the in-flight set, so
        the heartbeat stops extending their leases and the reaper recovers them
        under a new epoch (a redelivery does not start them again here: they
        were begun, see ``_start_unknown``). Verdicts still queued are kept and
        recorded on the restart, still heartbeated until then.
        """
        queued = []
        while not self.completions.empty():
            queued.append(self.completions.get_nowait())
        for item in queued:
            self.completions.put_nowait(item)
        waiting = {(p.completion.run_id, p.completion.epoch) for p in queued if p is not None}
        lost = [
            e
            for key, e in self.in_flight.items()
            if key not in waiting and (e.task is None or e.task.done())
        ]
        for entry in lost:
            self._forget(entry)
        if lost:
            log.warning(
                "worker loop crashed; its unfinished runs are left to their leases",
                runs=len(lost),
                run_ids=[e.run_id for e in lost][:20],
            )

    async def _run(self) -> None:
        self._fetch_backoff.reset()
        async with asyncio.TaskGroup() as group:
            completer = group.create_task(self._complete_loop())
            heartbeat = group.create_task(self.heartbeat.run())
            while not self.stop.is_set():
                if self.keeping.trouble() is not None:
                    await self._until_kept()
                    continue
                free = self.concurrency - len(self.in_flight)
                if free <= 0:
                    self._slot_freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slot_freed.wait(), 1.0)
                    continue
                await self._fetch_and_handle(min(free, 256), group)
            stopping = time.monotonic()
            await self._drain()
            await self._record_what_is_left(completer, stopping)
            self._hb_stop.set()
            await heartbeat

    async def _record_what_is_left(self, completer: asyncio.Task[None], since: float) -> None:
        """Queued verdicts get the rest of the grace, and a few seconds at least, to be recorded.

        Past that the database is not taking them (away, or its link went
        silent): the completer stops and their runs are left to their leases,
        rather than holding the stop until the replica forces it.
        """
        left = max(
            self.grace.total_seconds() - (time.monotonic() - since),
            min(self.keeping.stall_after, RECORD_AT_STOP_S),
        )
        try:
            async with asyncio.timeout(left):
                await self.completions.put(None)
                await completer  # cancelled with this wait when the time is up
        except TimeoutError:
            log.warning(
                "stopping: verdicts not recorded in time; their runs are left to their leases",
                runs=len(self.in_flight),
                waited_s=round(left, 3),
                run_ids=[e.run_id for e in self.in_flight.values()][:20],
            )

    async def _fetch_and_handle(self, batch: int, group: asyncio.TaskGroup) -> None:
        try:
            messages = await self.sub.fetch(batch, timeout=FETCH_TIMEOUT_S)
        except TimeoutError:
            # No message within the timeout: what an idle stream says, and all
            # that a dead connection says too. A few in a row: ask the broker.
            self._empty_fetches += 1
            if self._empty_fetches >= RESUBSCRIBE_AFTER:
                self._empty_fetches = 0
                await self._until_broker_answers()
            return
        except Exception as exc:  # noqa: BLE001 - fetch only talks to the broker: an outage
            self._empty_fetches = 0
            delay = self._fetch_backoff.next_delay()
            log.warning("fetch failed", error=repr(exc), delay_s=round(delay, 3))
            await asyncio.sleep(delay)
            if self._fetch_backoff.failures >= RESUBSCRIBE_AFTER:
                # The stream or consumer may be gone (a broker recreated
                # without its data): create them again and bind anew.
                await self._resubscribe()
            return
        self._empty_fetches = 0
        self._fetch_backoff.reset()
        await self.handle(messages, group)

    async def _resubscribe(self) -> None:
        if self.resubscribe is None:
            return
        try:
            self.sub = await self.resubscribe()
        except Exception as exc:  # noqa: BLE001 - the next failed fetches try again
            log.warning("resubscribe failed", error=repr(exc))
            return
        log.info("resubscribed to the dispatch stream")

    async def _until_kept(self) -> None:
        """Fetch nothing until the database calls the worker's runs depend on get through.

        A call that hangs is waited for (its own deadline ends it); a failure
        is retried by its owner (the heartbeat at each beat, the completer with
        backoff) and the database is pinged meanwhile: once it answers, beats
        and starts may go on, while unrecorded verdicts hold the pause until
        the completer records them.
        """
        trouble = self.keeping.trouble()
        if trouble is None:
            return
        began = self._paused(*trouble)
        backoff = Backoff(initial=0.1, maximum=1.0)
        while not self.stop.is_set():
            await wait_for_stop(self.stop, backoff.next_delay())
            if self.keeping.trouble() is None:
                break
            if self.keeping.stalled() is None and await self._store_probe():
                self.keeping.answered()
                if self.keeping.trouble() is None:
                    break
        self._resumed(trouble[0], began)

    async def _until_broker_answers(self) -> None:
        """After empty fetches: a ping; unanswered, no fetch until the broker is back."""
        probe = self._broker_probe
        if probe is None or await probe():
            return
        began = self._paused(
            "broker", f"no answer to a ping after empty fetches: {probe.last_error}"
        )
        backoff = Backoff(initial=0.2, maximum=2.0)
        while not self.stop.is_set():
            await wait_for_stop(self.stop, backoff.next_delay())
            if await probe():
                # Reconnected: bind again (a recreated broker may have lost the consumer).
                await self._resubscribe()
                break
        self._resumed("broker", began)

    def _paused(self, reason: str, detail: str) -> float:
        INTAKE_PAUSED.labels(actor="worker").set(1)
        INTAKE_PAUSES.labels(actor="worker", reason=reason).inc()
        log.warning(
            "worker takes no new runs: it could not keep them",
            reason=reason,
            detail=detail[:300],
            in_flight=len(self.in_flight),
        )
        return time.monotonic()

    def _resumed(self, reason: str, began: float) -> None:
        INTAKE_PAUSED.labels(actor="worker").set(0)
        if not self.stop.is_set():
            log.warning(
                "worker takes new runs again",
                reason=reason,
                paused_s=round(time.monotonic() - began, 3),
            )

    async def _drain(self) -> None:
        """Let in-flight runs finish up to the grace; cancel the rest (the lease recovers them)."""
        tasks = [e.task for e in self.in_flight.values() if e.task is not None]
        if not tasks:
            return
        log.info("draining in-flight runs", runs=len(tasks), grace_s=self.grace.total_seconds())
        _, pending = await asyncio.wait(tasks, timeout=self.grace.total_seconds())
        if not pending:
            return
        cut = [e for e in self.in_flight.values() if e.task in pending]
        for task in pending:
            task.cancel()
        await asyncio.wait(pending)
        try:
            async with asyncio.timeout(5):
                handed_back = await self.store.interrupt_runs(
                    self.worker_id, [(e.run_id, e.epoch) for e in cut]
                )
        except Exception as exc:  # noqa: BLE001 - stopping anyway; the leases recover them
            # Not re-raised even when it is a bug: the supervisor would restart the
            # worker in the middle of the stop. Logged at the level of what it is.
            level = "warning" if isinstance(exc, Outage | TimeoutError) else "error"
            getattr(log, level)(
                "grace expired; runs left to their leases", runs=len(cut), error=repr(exc)
            )
            return
        log.warning(
            "grace expired; unfinished runs handed back to pending",
            runs=handed_back,
            run_ids=[e.run_id for e in cut][:20],
        )
        for entry in cut:
            # That epoch's message is obsolete: the run will be claimed anew.
            await _quietly(entry.message.ack())

    # -- one fetched batch ---------------------------------------------------------------

    async def handle(self, deliveries: Sequence[Delivery], group: asyncio.TaskGroup) -> None:
        """Decode, start in one statement, spawn executions; settle what cannot start."""
        decoded: list[tuple[DispatchMessage, Delivery]] = []
        for delivery in deliveries:
            try:
                message = self.decode(delivery.data, self.deployment)
            except ValueError as exc:
                reason = getattr(exc, "reason", "invalid")
                POISON_MESSAGES.labels(reason=reason).inc()
                log.error("poison message terminated", reason=reason, error=str(exc)[:200])
                await _quietly(delivery.term())
                continue
            if self.delivery_count(delivery) > 1:
                REDELIVERIES.inc()
            if (message.run_id, message.epoch) in self.in_flight:
                # Executing here already (the broker redelivered while it ran):
                # settle this copy; the running one records and acks.
                DELIVERIES_SKIPPED.labels(reason="executing_here").inc()
                await _quietly(delivery.ack())
                continue
            decoded.append((message, delivery))
        if not decoded:
            return
        keys = [(m.run_id, m.epoch) for m, _ in decoded]
        retake = {k for k in keys if k in self._start_unknown}
        # Until its reply is in hand, a start may commit unseen (the connection
        # drops, or this task is cancelled while it waits): remembered first.
        self._remember_start_unknown(keys)
        try:
            with self.keeping.call(STARTS):
                started, not_started = await self.store.start_runs(
                    self.worker_id, [m for m, _ in decoded], self.lease, retake=retake
                )
        except Exception as exc:
            # Nothing began here: the broker redelivers, and these runs may be
            # taken up again then. An outage is waited out here (no fetch until
            # the database answers); anything else is a bug the supervisor must see.
            for _, delivery in decoded:
                await _quietly(delivery.nak(delay=1.0))
            if not isinstance(exc, Outage):
                raise
            self.keeping.failed(STARTS, repr(exc)[:200])
            log.warning(
                "start failed; messages will be redelivered", error=repr(exc), runs=len(decoded)
            )
            return
        self.keeping.succeeded(STARTS)
        by_key = {(m.run_id, m.epoch): d for m, d in decoded}
        # The started runs enter the in-flight set before anything else is
        # awaited: from here on they are begun, never to be taken up again.
        for run in started:
            key = (run.run_id, run.epoch)
            entry = InFlight(run.run_id, run.epoch, run.job, by_key[key])
            self.in_flight[key] = entry
            entry.task = group.create_task(self._execute(run, entry))
        for key in keys:
            self._start_unknown.pop(key, None)  # answered: started now, or never will be
        RUNS_IN_FLIGHT.set(len(self.in_flight))
        for skipped in not_started:
            DELIVERIES_SKIPPED.labels(reason=skipped.reason).inc()
            delivery = by_key[(skipped.run_id, skipped.epoch)]
            log.info(
                "delivery changed nothing",
                run_id=skipped.run_id,
                epoch=skipped.epoch,
                reason=skipped.reason,
                state=skipped.state,
            )
            # Unknown: not a run of this database; terminate so it is never redelivered.
            await _quietly(delivery.term() if skipped.reason == "unknown" else delivery.ack())

    def _remember_start_unknown(self, keys: Sequence[tuple[str, int]]) -> None:
        for key in keys:
            self._start_unknown[key] = None
            self._start_unknown.move_to_end(key)
        while len(self._start_unknown) > START_UNKNOWN_KEPT:
            self._start_unknown.popitem(last=False)

    async def _execute(self, run: StartedRun, entry: InFlight) -> None:
        RUNS_STARTED.labels(run.job).inc()
        if run.trigger == "schedule":
            # Triggered and backfilled runs are due when asked for, often long
            # ago: they would fill the top bucket and swamp the sum.
            now = self.clock.now() if self.clock is not None else datetime.now(UTC)
            lag = (now - (run.due_at or run.scheduled_at)).total_seconds()
            SCHEDULE_LAG.labels(run.job).observe(max(0.0, lag))
        bound = log.bind(run_id=run.run_id, job=run.job, attempt=run.attempt, epoch=run.epoch)
        bound.info("run started")
        try:
            result = await self.executor.execute(run.executor, run.context(), run.timeout)
        except asyncio.CancelledError:
            if entry.lease_lost:
                # Another attempt may own the run now; record nothing, settle the message.
                self._forget(entry)
                await _quietly(entry.message.ack())
                return
            self._forget(entry)
            raise
        except Exception as exc:  # noqa: BLE001 - an executor bug fails the run, not the worker
            bound.error("executor raised", error=repr(exc), exc_info=True)
            result = ExecutionResult(Outcome.FAILED, error=f"executor error: {exc!r}"[:1000])
        verdict = decide_attempt(
            result.outcome,
            state=RunState.RUNNING,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            policy=run.retry,
            run_id=run.run_id,
        )
        RUN_DURATION.labels(run.job).observe(result.duration.total_seconds())
        fields: dict[str, Any] = {
            "outcome": result.outcome.value,
            "exit_code": result.exit_code,
            "duration_s": round(result.duration.total_seconds(), 3),
        }
        if result.outcome is Outcome.SUCCEEDED:
            bound.info("run finished", **fields)
        elif verdict.retry:
            bound.warning(
                "run attempt failed; will retry",
                **fields,
                error=result.error,
                retry_in_s=None if verdict.due_in is None else verdict.due_in.total_seconds(),
                max_attempts=run.max_attempts,
            )
        else:
            # The last attempt: the run fails for good. What failed is in the line.
            bound.error(
                "run failed; no attempts left",
                **fields,
                error=result.error,
                max_attempts=run.max_attempts,
            )
        completion = Completion(run.run_id, run.epoch, result, verdict, self.worker_id)
        await self.completions.put(_Pending(completion, entry.message, run.job))

    def _forget(self, entry: InFlight) -> None:
        self.in_flight.pop((entry.run_id, entry.epoch), None)
        RUNS_IN_FLIGHT.set(len(self.in_flight))
        self._slot_freed.set()

    # -- completions ----------------------------------------------------------------------

    async def _complete_loop(self) -> None:
        """Record verdicts in batches, then ack each message whose run was recorded.

        Errors by kind: an outage is waited out (``_record`` retries; the lease
        has slack, and while the database is away the heartbeat cannot renew it
        either). Anything else is about some runs of the batch: the batch is
        recorded one by one, and the runs that still fail are abandoned to their
        leases. A refusal of the data (RecordRejected) is that run's alone; any
        other error is a bug, re-raised once the rest is settled, so that the
        supervisor counts it against the worker's crash budget.
        """
        done = False
        while not done:
            first = await self.completions.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < COMPLETION_BATCH and not self.completions.empty():
                item = self.completions.get_nowait()
                if item is None:
                    done = True
                    break
                batch.append(item)
            bug: Exception | None = None
            try:
                recorded = await self._record(batch)
            except Exception:  # noqa: BLE001 - not an outage: find the runs it is about
                recorded = set()
                kept = []
                for pending in batch:
                    try:
                        recorded |= await self._record([pending])
                        kept.append(pending)
                    except Exception as exc:  # noqa: BLE001 - abandoned; bugs re-raised below
                        await self._abandon(pending, exc)
                        if bug is None and not isinstance(exc, RecordRejected):
                            bug = exc
                batch = kept
            await self._settle(batch, recorded)
            if bug is not None:
                raise bug

    async def _record(self, batch: list[_Pending]) -> set[tuple[str, int]]:
        """complete_runs, retried while the database is unreachable; other errors raise.

        While it fails, the worker fetches nothing (``keeping``). The backoff
        stays short: once the database is back, this batch holds every later
        verdict and the worker's intake.
        """
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            try:
                with self.keeping.call(COMPLETIONS):
                    # Shielded: a completion that reached the database must be acted on.
                    recorded = await asyncio.shield(
                        self.store.complete_runs([p.completion for p in batch])
                    )
                self.keeping.succeeded(COMPLETIONS)
                return recorded
            except Outage as exc:
                self.keeping.failed(COMPLETIONS, repr(exc)[:200])
                delay = backoff.next_delay()
                log.warning(
                    "complete failed; retrying",
                    runs=len(batch),
                    error=repr(exc),
                    delay_s=round(delay, 3),
                )
                await self.keeping.rest(delay)

    async def _abandon(self, pending: _Pending, exc: Exception) -> None:
        """Give up recording one attempt; its lease lapses and the reaper recovers the run.

        The run leaves the in-flight set, so the heartbeat no longer extends its
        lease. Its message is terminated, not acked (nothing was recorded), and
        not left to be redelivered: a redelivery would change nothing anyway
        (START_RUNS does not take up again a run this worker began), and the
        run's recovery never depended on the message: the reaper returns it to
        pending and the next claim dispatches it under a new epoch.
        """
        c = pending.completion
        key = (c.run_id, c.epoch)
        COMPLETIONS_REJECTED.inc()
        refused = isinstance(exc, RecordRejected)
        log.error(
            "completion rejected by the database; the lease will recover the run"
            if refused
            else "completion could not be recorded (unexpected error); "
            "the lease will recover the run",
            run_id=c.run_id,
            job=pending.job,
            epoch=c.epoch,
            error=repr(exc)[:500],
        )
        entry = self.in_flight.get(key)
        if entry is not None:
            self._forget(entry)  # stop heartbeating it, so its lease can expire
        await _quietly(pending.delivery.term())

    async def _settle(self, batch: list[_Pending], recorded: set[tuple[str, int]]) -> None:
        self._recorded_batches += 1
        if self.after_record is not None:
            self.after_record(batch)
        if (
            self.faults.exit_after_complete
            and self._recorded_batches >= self.faults.exit_after_complete
        ):
            log.warning("fault injection: exiting after complete, before ack")
            os._exit(97)
        for pending in batch:
            c = pending.completion
            key = (c.run_id, c.epoch)
            if key in recorded:
                RUNS_COMPLETED.labels(pending.job, c.result.outcome.value).inc()
                verdict = c.verdict or AttemptVerdict.final(c.result.outcome)
                if verdict.state is RunState.FAILED:
                    RUNS_FAILED_FINALLY.labels(pending.job).inc()
            else:
                # The epoch moved on (reaped, cancelled): this execution was a duplicate.
                FENCED_COMPLETIONS.inc()
                log.warning(
                    "completion fenced: the run moved on",
                    run_id=c.run_id,
                    job=pending.job,
                    epoch=c.epoch,
                )
            await _quietly(pending.delivery.ack())
            entry = self.in_flight.get(key)
            if entry is not None:
                self._forget(entry)


async def _quietly(awaitable: Any) -> None:
    """Ack/term/nak are best effort: a lost ack means a redelivery, which changes nothing."""
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001
        log.warning("broker reply failed", error=repr(exc))

"""Where a claimd process spends its samples: py-spy's collapsed stacks, by step.

Reads the files ``bench_drain --py-spy DIR`` writes (``py-spy record --format
raw``: one line per distinct stack, frames root first separated by ``;``,
then the sample count) and prints, per file, the share of samples of each
step of the hot path (the innermost step frame of each stack decides), and
within the steps that matter most what their time goes to.

    python -m bench.profile_summary DIR/*.txt
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# (step, frame names that mark it); for each sample the innermost frame that
# names a step wins, so a step nested in another (a fetch inside the worker
# loop) is counted as itself.
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("worker: fetch", ("JetStreamContext.PullSubscription.fetch",)),
    ("worker: decode (inbox)", ("JetStreamInbox._decoded",)),
    ("worker: start + spawn", ("Worker.handle", "Starter.start")),
    ("worker: per-run task (execute)", ("Worker._execute", "Execution.__call__")),
    (
        "worker: complete (record)",
        ("Worker._record", "Completer._record", "PostgresRunStore.complete_runs"),
    ),
    ("worker: settle + ack", ("Worker._settle", "Completer._settle")),
    ("worker: loop, other", ("Worker.run", "Worker._complete_loop", "Completer.run")),
    ("heartbeat", ("Heartbeat.run",)),
    ("dispatcher: publish", ("Dispatcher.run",)),
    ("publish acks (nats-py callback)", ("JetStreamContext._handle_async_reply",)),
    ("claimer (skip, count, claim)", ("Claimer.run",)),
    ("materializer", ("Materializer.run",)),
    ("reaper", ("Reaper.run",)),
    ("compensator", ("Compensator.run",)),
    ("nats-py read loop (parse, route)", ("Client._read_loop",)),
    ("nats-py flusher (socket writes)", ("Client._flusher",)),
    ("socket reads (asyncpg replies)", ("_SelectorSocketTransport._read_ready",)),
    ("waiting in epoll", ("EpollSelector.select",)),
)
# Within a step: what the samples are spent on (innermost match, else "itself").
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "SQL round trip (asyncpg)",
        ("Pool.fetch", "Pool.execute", "Connection.fetch", "Connection.execute", "Pool.fetchval"),
    ),
    ("executor (run_python)", ("LocalExecutor.execute",)),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("logging (structlog)", ("structlog/",)),
    ("message decode", ("decode (actors/adapters/nats.py",)),
    ("message encode", ("encode (actors/adapters/nats.py",)),
    ("nats-py publish_async", ("JetStreamContext.publish_async",)),
    ("nats-py ack/term/nak", ("Msg.ack", "Msg.term", "Msg.nak")),
    ("msg.metadata (delivery count)", ("Msg.metadata",)),
    ("nats-py next_msg (a task per message)", ("Subscription.next_msg",)),
    ("task creation", ("BaseEventLoop.create_task", "TaskGroup.create_task")),
    ("asyncio.wait_for (timeout wrapper)", ("wait_for (asyncio/tasks.py",)),
    ("definitions / StartedRun", ("_started_run", "DecodedJobs")),
    ("asyncio queue", ("Queue.put", "Queue.get")),
)


def _stacks(path: Path) -> Iterable[tuple[list[str], int]]:
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(count)


def _matches(frame: str, mark: str) -> bool:
    """``pkg/``: any frame of that package; ``func (path``: that function of that file;
    else the function's qualified name exactly."""
    if mark.endswith("/"):
        return f"({mark}" in frame
    if " (" in mark:
        return frame.startswith(mark)
    return frame.startswith(mark + " ")


def _innermost(frames: Sequence[str], rules: Sequence[tuple[str, tuple[str, ...]]]) -> str | None:
    for frame in reversed(frames):
        for name, marks in rules:
            if any(_matches(frame, m) for m in marks):
                return name
    return None


def summarize(path: Path, detail: int) -> None:
    steps: collections.Counter[str] = collections.Counter()
    parts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for frames, n in _stacks(path):
        total += n
        step = _innermost(frames, STEPS) or "event loop, other"
        steps[step] += n
        part = _innermost(frames, PARTS) or "itself"
        parts[step][part] += n
    busy = total - steps["waiting in epoll"]
    print(f"\n{path.name}: {total} samples, {busy} not waiting in epoll")
    print("  % of samples not in epoll, by step (and within it)")
    for step, n in steps.most_common():
        if step == "waiting in epoll":
            continue
        print(f"  {100 * n / busy:5.1f}  {step}")
        for part, m in parts[step].most_common(detail):
            if m * 100 >= busy * 0.3:
                print(f"         {100 * m / busy:5.1f}  {part}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--detail", type=int, default=6, help="parts shown per step")
    args = parser.parse_args(argv)
    for path in args.files:
        summarize(path, args.detail)


if __name__ == "__main__":
    main(sys.argv[1:])

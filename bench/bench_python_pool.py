"""Sync python attempts through the warm pool: the replica's CPU per attempt, and wall time.

``LocalExecutor().execute`` with a ``PythonSpec`` (the warm pool of
``actors/adapters/executors/pool.py``), no database, no broker: the cost of an
attempt to the process that hands it to a warm child, which is what a herd of
sync runs spends in a replica. Cases, after a warm-up that forks the children:

- ``seq``: one child, attempts one after another;
- ``c64``: 64 children, attempts 64 at once;
- ``c64-print``: the same with a job that prints one line (its tail is read).

Reported per tree: parent CPU per attempt (``time.process_time``, the replica's
process only), the children's CPU per attempt (their ``/proc`` schedstat: the
warm children, not the fork server), and wall time. The baseline is another tree
(``--against``, an export of the code before, e.g. ``git archive HEAD~1 | tar -x -C
/tmp/before``), each tree run in a
process of its own with ``PYTHONPATH`` set to it, in turns (``--rounds``), so a
loaded machine's drift falls on both.

    python -m bench.bench_python_pool [--attempts 2000] [--seq 500] [--rounds 2]
        --against /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
JOB_MODULE = "pool_bench_job"


def _child_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes so far (``/proc/PID/schedstat``: nanoseconds on a CPU,
    not the stat file's 10 ms ticks, too coarse for 64 children a few attempts each)."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


async def _case(name: str, target: str, size: int, attempts: int, at_once: int) -> dict[str, float]:
    from actors.adapters.executors import LocalExecutor
    from actors.domain import Outcome, PythonSpec, RunContext

    executor = LocalExecutor(python_processes=size)
    spec = PythonSpec(f"{JOB_MODULE}:{target}")
    timeout = timedelta(seconds=60)
    gate = asyncio.Semaphore(at_once)
    failed = 0

    async def one(n: int) -> None:
        nonlocal failed
        context = RunContext(
            "6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10", "bench", datetime.now(UTC), n, 1
        )
        async with gate:
            result = await executor.execute(spec, context, timeout)
        if result.outcome is not Outcome.SUCCEEDED:
            failed += 1

    await asyncio.gather(*(one(n) for n in range(size)))  # the children, forked
    pool = executor.python.pool
    pids = [child.pid.result() for child in pool._idle]
    child_before = _child_cpu(pids)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(attempts)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    child_cpu = _child_cpu(pids) - child_before
    await executor.python.pool.close()
    await executor.python.children.close()
    return {
        "parent_us": cpu / attempts * 1e6,
        "child_us": child_cpu / attempts * 1e6,
        "wall_s": wall,
        "failed": failed,
    }


async def _inner(attempts: int, seq: int) -> dict[str, object]:
    import actors

    return {
        "actors": str(Path(actors.__file__).parent.parent),
        "seq": await _case("seq", "noop", 1, seq, 1),
        "c64": await _case("c64", "noop", 64, attempts, 64),
        "c64-print": await _case("c64-print", "talk", 64, attempts, 64),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000)
    parser.add_argument("--seq", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", help="the baseline's source tree (required)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(asyncio.run(_inner(args.attempts, args.seq))))
        return
    if not args.against:
        parser.error("--against TREE is required: the baseline, measured in the same run")
    from bench.common import rounds_against  # the outer process only (see there)

    inner = ["--attempts", str(args.attempts), "--seq", str(args.seq)]
    for round_, label, found in rounds_against(
        __file__, args.against, args.rounds, JOB_MODULE, inner
    ):
        print(f"round {round_} {label:9} ({found['actors']})")
        for case in ("seq", "c64", "c64-print"):
            figures = found[case]
            assert isinstance(figures, dict)
            count = args.seq if case == "seq" else args.attempts
            print(
                f"  {case:9} {count:5} attempts: parent {figures['parent_us']:7.0f} µs"
                f" CPU/attempt, children {figures['child_us']:6.0f} µs CPU/attempt,"
                f" wall {figures['wall_s']:6.2f} s, failed {figures['failed']}"
            )


if __name__ == "__main__":
    main()

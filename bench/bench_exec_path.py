"""The replica's own cost of one async python run's execution, herd-sized, in one process.

N async no-op runs (``bench.common:anoop``) handed at once to the executor a
replica uses (live output around the local executor, the job loop on its own
thread): wall time and this process's CPU per run, for this tree and, with
``--against TREE``, another source tree measured in the same run (each in its
own process, taking turns). What it leaves out: the start statement, the
completion, the broker. Prints figures; asserts nothing.

    python -m bench.bench_exec_path --runs 5000 --rounds 3
    git archive HEAD~3 | tar -x -C /tmp/before
    python -m bench.bench_exec_path --against /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


async def _measure(runs: int) -> dict[str, float]:
    from actors.adapters.executors import LocalExecutor
    from actors.adapters.live_output import LiveOutputExecutor, OutputRelay
    from actors.domain import PythonSpec, RunContext

    executor = LiveOutputExecutor(LocalExecutor(), OutputRelay("claimd.bench"))
    spec = PythonSpec("bench.common:anoop")
    now = datetime.now(UTC)
    contexts = [
        RunContext(run_id=f"run-{i}", job=f"job-{i}", scheduled_at=now, attempt=1, fencing_token=1)
        for i in range(runs)
    ]
    timeout = timedelta(seconds=60)
    await executor.execute(spec, contexts[0], timeout)  # the job loop started, the module loaded
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(executor.execute(spec, c, timeout) for c in contexts))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def _one(tree: Path, runs: int) -> dict[str, float]:
    # This file, run with the tree's own actors and bench.common first on the path.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--inner", str(runs)],
        env=env, cwd=tree, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--against", help="another source tree, measured in the same run")
    p.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        print(json.dumps(asyncio.run(_measure(args.inner))))
        return
    here = Path(__file__).resolve().parents[1]
    trees = [("this tree", here)] + ([("against", Path(args.against))] if args.against else [])
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load {load:.1f}, {args.runs} async no-op runs at once")
    print(f"{'tree':<10} {'round':>5} {'wall s':>8} {'cpu s':>8} {'cpu us/run':>11}")
    for r in range(args.rounds):
        for label, tree in trees:
            got = _one(tree, args.runs)
            per = got["cpu_s"] / args.runs * 1e6
            print(f"{label:<10} {r + 1:>5} {got['wall_s']:>8.3f} {got['cpu_s']:>8.3f} {per:>11.0f}")


if __name__ == "__main__":
    main()

"""One /metrics render at 100,000 jobs where 1% of the jobs changed since the last scrape.

The per-job series a replica registers (``init_series``, ``init_job_series``,
run histograms not by job: the default above 1,000 jobs) and the cluster
gauges of every job (a new snapshot before each scrape, as the refresh
builds it) are populated directly, in this process: no server, no database.
Between two scrapes ``--changed`` of the jobs ran (a start, a success, a new
last success in the cluster snapshot). Printed: the wall and CPU time of one
render (``render_chunks``, the thread's work in a scrape; median of
``--rounds``), the first render after start, the page's size, whether the
pages are byte for byte the same, and what the text kept between scrapes
costs (tracemalloc: what a first render leaves allocated).

The baseline, in the same run: every line written afresh
(``render_chunks(reuse=False)``); and with ``--against`` a checkout of the
tree before the text was kept, measured in a subprocess:

    python -m bench.bench_scrape
    git archive 3d77a92 | tar -x -C /tmp/before
    python -m bench.bench_scrape --against /tmp/before --against-label 3d77a92
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any


def measure(jobs: int, rounds: int, changed: float, memory: bool) -> dict[str, Any]:
    """The figures of the tree on sys.path (``actors`` as imported here)."""
    from actors.observability import (
        CLUSTER,
        RUNS_COMPLETED,
        RUNS_STARTED,
        ClusterSnapshot,
        JobSnapshot,
        exposition,
        init_job_series,
        init_series,
        per_job_histograms,
    )
    from actors.observability.exposition import render_chunks

    reusable = "reuse" in inspect.signature(render_chunks).parameters
    names = [f"job-{i:06d}" for i in range(jobs)]
    init_series()
    per_job_histograms(False)
    init_job_series(names)
    rng = random.Random(24)
    last_success: list[float | None] = [None] * jobs
    for i in range(0, jobs, 3):  # a third of the jobs ran before
        RUNS_STARTED.labels(names[i]).inc(rng.randint(1, 50))
        RUNS_COMPLETED.labels(names[i], "succeeded").inc(rng.randint(1, 50))
        last_success[i] = 1.7e9 + rng.random() * 1e6

    def refresh() -> None:
        """A new snapshot of new JobSnapshot objects, as ClusterMetrics.refresh makes."""
        CLUSTER.update(
            ClusterSnapshot(
                jobs=tuple(
                    JobSnapshot(n, False, last_success[i], None, 0, 0.0, 60.0, 0.0, "healthy")
                    for i, n in enumerate(names)
                ),
                claimed=3,
                running=5,
            )
        )

    def some_ran() -> None:
        for i in rng.sample(range(jobs), max(1, int(jobs * changed))):
            RUNS_STARTED.labels(names[i]).inc()
            RUNS_COMPLETED.labels(names[i], "succeeded").inc()
            last_success[i] = 1.8e9 + rng.random() * 1e6  # the same in every tree
        refresh()

    def render(reuse: bool | None) -> tuple[float, float, list[bytes]]:
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        page = list(render_chunks() if reuse is None else render_chunks(reuse=reuse))
        return time.perf_counter() - wall, time.process_time() - cpu, page

    def per_job_part(page: list[bytes]) -> bytes:
        return b"".join(page[1:])  # the first chunk: generate_latest's (its age gauge moves)

    modes: list[bool | None] = [False, True] if reusable else [None]
    refresh()
    out: dict[str, Any] = {"modes": {}}
    for mode in modes:
        wall, cpu, page = render(mode)
        out["modes"][_label(mode)] = {"first_wall_s": wall, "first_cpu_s": cpu, "walls": []}
        out["modes"][_label(mode)]["cpus"] = []
        out["bytes"] = sum(map(len, page))
    digests: dict[str, set[str]] = {}
    for _ in range(rounds):
        some_ran()
        for mode in modes:
            wall, cpu, page = render(mode)
            figures = out["modes"][_label(mode)]
            figures["walls"].append(wall)
            figures["cpus"].append(cpu)
            digest = hashlib.sha256(per_job_part(page)).hexdigest()
            digests.setdefault(str(len(figures["walls"])), set()).add(digest)
            del page
    out["identical"] = all(len(d) == 1 for d in digests.values())
    out["digests"] = sorted(digests[str(rounds)]) if rounds else []
    if memory and reusable:
        out["kept_bytes"] = _kept_bytes(exposition, render)
    return out


def _label(mode: bool | None) -> str:
    return {None: "before", False: "afresh", True: "kept"}[mode]


def _kept_bytes(exposition: Any, render: Any) -> int:
    """What one render leaves allocated with nothing kept before it (the page dropped)."""
    for writer in exposition._WRITERS:  # forget what earlier renders kept
        if hasattr(writer, "_written"):  # a JobCounter's or the cluster gauges'
            writer._written = tuple(type(part)() for part in writer._written)
        for child in getattr(writer, "_children", {}).values():
            child.written = None
        if getattr(writer, "_all", None) is not None:
            writer._all.written = None
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    render(True)  # the page is dropped on return
    gc.collect()
    kept = int(tracemalloc.get_traced_memory()[0] - before)
    tracemalloc.stop()
    return kept


def _in(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of a checkout, in a subprocess with its ``actors`` first on the path
    (this file is loaded by its path: an older tree has no copy of it)."""
    code = (
        "import importlib.util, json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "spec = importlib.util.spec_from_file_location('bench_scrape', sys.argv[2])\n"
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
        "out = bench.measure(int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),"
        " sys.argv[6] == '1')\n"
        "import actors; out['actors'] = actors.__file__\n"
        "print(json.dumps(out))\n"
    )
    argv = [str(tree), __file__, str(args.jobs), str(args.rounds), str(args.changed)]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv, "0" if args.no_memory else "1"],
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if done.returncode != 0:
        sys.exit(f"{tree}: the measurement failed\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["actors"].startswith(str(tree)), result["actors"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--changed", type=float, default=0.01, help="share of jobs that ran")
    parser.add_argument("--against", type=Path, help="a checkout to measure beside this tree")
    parser.add_argument("--against-label", default="before")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    results = [("this tree", _in(here, args))]
    if args.against is not None:
        results.insert(0, (args.against_label, _in(args.against, args)))
    print(
        f"one /metrics render at {args.jobs:,} jobs, {args.changed:.0%} of them changed "
        f"since the last scrape (median of {args.rounds}; CPU = user + system)"
    )
    for tree, figures in results:
        print(f"  {tree}: page {figures['bytes'] / 1e6:.1f} MB")
        for mode, f in figures["modes"].items():
            print(
                f"    {mode:<7} wall {statistics.median(f['walls']):6.3f} s   "
                f"CPU {statistics.median(f['cpus']):6.3f} s   "
                f"(first render: wall {f['first_wall_s']:.3f} s, CPU {f['first_cpu_s']:.3f} s)"
            )
        if len(figures["modes"]) > 1:
            same = "yes" if figures["identical"] else "NO"
            print(f"    pages afresh and kept byte for byte the same: {same}")
        if tree != results[0][0]:
            same = figures["digests"] == results[0][1]["digests"]
            print(f"    the same page as {results[0][0]}'s: {'yes' if same else 'NO'}")
        if "kept_bytes" in figures:
            kept = figures["kept_bytes"]
            print(
                f"    text kept between scrapes (tracemalloc): {kept / 1e6:.1f} MB, "
                f"{kept / args.jobs:.0f} bytes a job"
            )


if __name__ == "__main__":
    main()

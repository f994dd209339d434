"""A warm child's own CPU per sync python attempt, and where it goes.

One real warm child (``warm_child.serve``, forked here, no fork server, no
event loop) is driven attempt after attempt by a plain loop: the request on
its socket, the answer back, its output pipe read to the marker, as the pool
does. A no-op job, and one that prints a line. Reported per tree:

- ``child``: the child's CPU per attempt (``/proc/PID/schedstat``), uninstrumented;
- ``steps`` (``--steps``): the same child with each of its steps wrapped in a
  timer (``perf_counter_ns``, median per attempt, so a preemption on a loaded
  host does not count): where that CPU goes, relatively. The timers are in the
  figures (an instrumented child spent about twice the CPU of a plain one).

The baseline is another tree (``--against``, an export of the code
before), each tree in a process of its own with ``PYTHONPATH`` set to it, in
turns (``--rounds``), so a loaded host's drift falls on both.

    python -m bench.bench_warm_child [--attempts 5000] [--rounds 3] [--steps]
        --against /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
JOB_MODULE = "warm_child_bench_job"
# (module, attribute) of each step timed with --steps, as the child looks them up: this
# tree's names and the baseline's (a step missing from a tree is left out).
STEPS = (
    ("socket", "recv_fds"),
    ("warm_child", "_receive"),
    ("pickle", "loads"),
    ("os", "dup2"),
    ("warm_child._Environment", "set"),
    ("warm_reset.Environment", "set"),
    ("log_context", "set_process_run"),
    ("os", "chdir"),
    ("warm_child", "_default_signals"),
    ("warm_reset", "default_signals"),
    ("warm_child", "_streams"),
    ("warm_reset.Streams", "set"),
    ("warm_child", "preload"),
    ("warm_child", "resolve"),
    ("warm_child", "_alone"),
    ("warm_child", "_end_output"),
    ("pickle", "dumps"),
    ("socket.socket", "sendall"),
)


def _cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _faults(pid: int) -> int:
    """Its minor page faults so far (copy-on-write of the fork server's pages among them)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[7])


def _instrument(report_fd: int) -> None:
    """In the child: each step wrapped in a timer, summed per attempt (from one
    ``_attempt`` to the next); the figures go to ``report_fd`` at its ``os._exit``."""
    from actors.adapters.executors import log_context, warm_child

    owners: dict[str, Any] = {
        "socket": socket,
        "socket.socket": socket.socket,
        "pickle": pickle,
        "os": os,
        "warm_child": warm_child,
        "warm_child._Environment": getattr(warm_child, "_Environment", None),
        "log_context": log_context,
    }
    try:
        from actors.adapters.executors import warm_reset

        owners["warm_reset"] = warm_reset
        owners["warm_reset.Environment"] = warm_reset.Environment
        owners["warm_reset.Streams"] = warm_reset.Streams
    except ImportError:  # the baseline's tree
        pass
    spent: dict[str, list[int]] = {}
    current: dict[str, int] = {}

    def timed(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return func(*args, **kwargs)
            finally:
                current[name] = current.get(name, 0) + time.perf_counter_ns() - start

        return wrapper

    for owner, attr in STEPS:
        found = owners.get(owner)
        if found is not None and hasattr(found, attr):
            setattr(found, attr, timed(f"{owner}.{attr}", getattr(found, attr)))
    attempt, leave = warm_child._attempt, os._exit

    def boundary(*args: Any) -> Any:
        for name, value in current.items():
            spent.setdefault(name, []).append(value)
        current.clear()
        return attempt(*args)

    def report(code: int) -> None:
        os.write(report_fd, json.dumps(spent).encode())
        leave(code)

    warm_child._attempt = boundary  # type: ignore[assignment]
    os._exit = report  # type: ignore[assignment]


def _drive(target: str, attempts: int, steps: bool) -> dict[str, Any]:
    try:
        from actors.adapters.executors.child_output import MARK
    except ImportError:  # a tree before the one output pipe per child: another protocol
        sys.exit("the tree has no child_output.py: a baseline from 1fc6f5d (one pipe a child) on")
    from actors.adapters.executors.warm_child import serve
    from actors.domain import RunContext

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_fd, write_fd = os.pipe()
    report_r, report_w = os.pipe()
    marker = MARK + os.urandom(16)
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(read_fd)
        os.close(report_r)
        if steps:
            _instrument(report_w)
        serve(theirs, [])
    theirs.close()
    os.close(report_w)
    home = os.getcwd()
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLAIMD_")}

    def one(n: int) -> None:
        context = RunContext(
            "6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10", "bench", datetime.now(UTC), n, 1
        )
        request = (target, context, 1, base if n == 0 else None, home, marker if n == 0 else None)
        if n == 0:
            socket.send_fds(ours, [pickle.dumps(request)], [write_fd])
            os.close(write_fd)
        else:
            ours.send(pickle.dumps(request))
        kind, verdict, reusable = pickle.loads(ours.recv(1 << 16))
        if (kind, verdict, reusable) != ("done", {"outcome": "succeeded"}, True):
            raise RuntimeError(f"attempt {n}: {verdict}")
        seen = b""
        while not seen.endswith(marker):
            seen += os.read(read_fd, 65536)

    for n in range(50):  # warm: the module imported, the first attempt's pipe passed
        one(n)
    before, faults_before = _cpu_ns(pid), _faults(pid)
    began = time.perf_counter()
    for n in range(50, 50 + attempts):
        one(n)
    wall = time.perf_counter() - began
    child_us = (_cpu_ns(pid) - before) / attempts / 1e3
    faults = (_faults(pid) - faults_before) / attempts
    ours.close()
    report = b""
    while chunk := os.read(report_r, 1 << 20):
        report += chunk
    os.close(report_r)
    os.waitpid(pid, 0)
    found: dict[str, Any] = {
        "child_us": child_us,
        "wall_us": wall / attempts * 1e6,
        "faults": faults,
    }
    if steps and report:
        spent = json.loads(report)
        found["steps"] = {
            name: statistics.median(values[50:]) / 1e3 for name, values in spent.items()
        }
    return found


def _inner(attempts: int, steps: bool) -> dict[str, Any]:
    import actors

    result: dict[str, Any] = {"actors": str(Path(actors.__file__).parent.parent)}
    for target in ("noop", "talk"):
        result[target] = _drive(f"{JOB_MODULE}:{target}", attempts, False)
        if steps:
            result[target]["steps"] = _drive(f"{JOB_MODULE}:{target}", attempts, True)["steps"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", action="store_true")
    parser.add_argument("--against", help="the baseline's source tree (required)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(_inner(args.attempts, args.steps)))
        return
    if not args.against:
        parser.error("--against TREE is required: the baseline, measured in the same run")
    from bench.common import rounds_against  # the outer process only (see there)

    inner = ["--attempts", str(args.attempts), *(["--steps"] if args.steps else [])]
    for round_, label, found in rounds_against(
        __file__, args.against, args.rounds, JOB_MODULE, inner
    ):
        print(f"round {round_} {label:9} ({found['actors']})")
        for target in ("noop", "talk"):
            figures = found[target]
            print(
                f"  {target:5} child {figures['child_us']:6.1f} µs CPU/attempt,"
                f" round trip {figures['wall_us']:6.1f} µs,"
                f" page faults/attempt {figures['faults']:5.2f}"
            )
            for name, us in figures.get("steps", {}).items():
                print(f"        {name:36} {us:6.1f} µs (median)")


if __name__ == "__main__":
    main()

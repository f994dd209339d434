"""CPU of /metrics scrapes at 10,000 jobs: every scrape rendering its page, or one a second.

One in-process HTTP server (``build_app``, the replica's routes) with the
per-job series of ``--jobs`` jobs created (run histograms not by job: the
default above 1,000 jobs). ``--scrapes`` scrapes are made over HTTP twice:
all at once (several scrapers, or one client hammering the port) and one
after another; the process's CPU time (user + system) for each is printed.

The baseline is the tree before the page was shared: give it with
``--against`` (a checkout of that commit) and its figures are measured in a
subprocess of the same machine, in the same run:

    python -m bench.bench_metrics_cache
    git archive ad76f8f | tar -x -C /tmp/before
    python -m bench.bench_metrics_cache --against /tmp/before --against-label ad76f8f
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer


async def _scrape(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as response:
        assert response.status == 200, response.status
        return len(await response.read())


async def measure(jobs: int, scrapes: int) -> dict[str, Any]:
    """The figures of the tree on sys.path (``actors`` as imported here)."""
    from actors.http.server import build_app
    from actors.observability import init_job_series, init_series, per_job_histograms

    init_series()
    per_job_histograms(False)
    init_job_series(f"job-{i:05d}" for i in range(jobs))

    async def ready() -> dict[str, Any]:
        return {"postgres": "ok", "nats": "ok"}

    out: dict[str, Any] = {}
    async with TestServer(build_app(ready)) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("/metrics"))
        out["bytes"] = await _scrape(http, url)  # warm: imports, first allocations
        await asyncio.sleep(1.5)  # past any page kept from the warm-up
        for mode in ("concurrent", "sequential"):
            cpu, wall = time.process_time(), time.monotonic()
            if mode == "concurrent":
                await asyncio.gather(*(_scrape(http, url) for _ in range(scrapes)))
            else:
                for _ in range(scrapes):
                    await _scrape(http, url)
            out[mode] = {
                "cpu_s": round(time.process_time() - cpu, 2),
                "wall_s": round(time.monotonic() - wall, 2),
            }
            await asyncio.sleep(1.5)
    return out


def _in(tree: Path, jobs: int, scrapes: int) -> dict[str, Any]:
    """The figures of a checkout, measured in a subprocess with its ``actors`` first on
    the path (this file is loaded by its path: an older tree has no copy of it)."""
    code = (
        "import asyncio, importlib.util, json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "spec = importlib.util.spec_from_file_location('bench_metrics_cache', sys.argv[2])\n"
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
        "out = asyncio.run(bench.measure(int(sys.argv[3]), int(sys.argv[4])))\n"
        "import actors; out['actors'] = actors.__file__\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tree), __file__, str(jobs), str(scrapes)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["actors"].startswith(str(tree)), result["actors"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--against", type=Path, help="a checkout to measure beside this tree")
    parser.add_argument("--against-label", default="before")
    args = parser.parse_args()
    rows = []
    if args.against is not None:
        rows.append((args.against_label, _in(args.against, args.jobs, args.scrapes)))
    here = Path(__file__).resolve().parent.parent
    rows.append(("this tree", _in(here, args.jobs, args.scrapes)))
    print(f"{args.scrapes} scrapes of /metrics at {args.jobs:,} jobs (CPU = user + system)")
    for label, figures in rows:
        print(
            f"  {label:<12} page {figures['bytes'] / 1e6:.1f} MB   "
            f"concurrent: CPU {figures['concurrent']['cpu_s']:.2f} s, "
            f"wall {figures['concurrent']['wall_s']:.2f} s   "
            f"sequential: CPU {figures['sequential']['cpu_s']:.2f} s, "
            f"wall {figures['sequential']['wall_s']:.2f} s"
        )


if __name__ == "__main__":
    main()

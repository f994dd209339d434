"""/metrics of one real `claimd run` with many jobs: per-job histograms on and off.

Each configuration is a `claimd run` process (every actor) on a schema and a
stream of its own, with ``--jobs`` jobs (half every minute, half daily, as
bench_tick_cost's mixed run). Once the replica is ready and has created every
job's series, ``/metrics`` is scraped ``--scrapes`` times over HTTP, as
Prometheus would. Printed per configuration: the size of a scrape, its samples
and families (counted by prometheus_client's own parser, which also shows the
text parses), the median time of a scrape, and the process's RSS.

The baseline is the default, ``job_histograms = true``, measured in the same
run beside ``job_histograms = false``.

    python -m bench.bench_metrics                   # 10,000 jobs, ~2 min
    python -m bench.bench_metrics --jobs 1000 --scrapes 3
    git archive 4a338f2 | tar -x -C /tmp/before     # and the renderer before, same run:
    python -m bench.bench_metrics --against /tmp/before --against-label 4a338f2
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    REPO,
    Row,
    bench_schema,
    child_env,
    config_toml,
    delete_stream,
    environment,
    free_port,
    migrated_store,
    print_table,
    rss_mb,
    stop_processes,
)
from tests.servers import unique_name

CONFIGS = {"job_histograms = true": True, "job_histograms = false": False}


def mixed_jobs(n_jobs: int) -> str:
    """Half every minute, half daily at 03:00, each running an async no-op."""
    return "\n".join(
        textwrap.dedent(f"""
            [jobs.job-{i:05d}]
            {'every = "1m"' if i % 2 == 0 else 'cron = "0 3 * * *"'}
            run = {{ python = "bench.common:anoop" }}
        """)
        for i in range(n_jobs)
    )


def _get(url: str, timeout: float = 30.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except OSError:
        return 0, b""


def _start(config: Path, log: Path, tree: Path) -> subprocess.Popen[bytes]:
    """`python -m` puts the working directory first on the path: ``tree``'s actors run."""
    return subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "run", "--config", str(config)],
        cwd=tree,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


async def measure(
    label: str, per_job: bool | None, args: argparse.Namespace, tree: Path = REPO
) -> dict[str, float]:
    """One configuration; ``per_job`` None: the setting left out (a tree that lacks it)."""
    deployment = unique_name("bench")
    port = free_port()
    last_job = f'claimd_job="job-{args.jobs - 1:05d}"'.encode()
    try:
        async with bench_schema() as url, migrated_store(url, max_size=2):
            with tempfile.TemporaryDirectory(prefix="claimd-metrics-") as tmp:
                config = Path(tmp) / "claimd.toml"
                settings = {} if per_job is None else {"job_histograms": per_job}
                config.write_text(
                    config_toml(url, deployment, mixed_jobs(args.jobs), **settings).replace(
                        'http = "off"', f'http = "127.0.0.1:{port}"'
                    )
                )
                log = Path(tmp) / "claimd.log"
                proc = _start(config, log, tree)
                try:
                    base = f"http://127.0.0.1:{port}"
                    deadline = time.monotonic() + args.max_seconds
                    while True:
                        if proc.poll() is not None:
                            tail = log.read_text(errors="replace")[-2000:]
                            raise SystemExit(f"{label}: claimd exited {proc.returncode}: {tail}")
                        if time.monotonic() > deadline:
                            raise SystemExit(f"{label}: not ready in {args.max_seconds} s")
                        status, _ = await asyncio.to_thread(_get, base + "/readyz", 5.0)
                        if status == 200:
                            status, body = await asyncio.to_thread(_get, base + "/metrics")
                            # Ready, every job's series created, the cluster gauges read.
                            if (
                                status == 200
                                and last_job in body
                                and b"claimd_job_overdue_runs{" in body
                            ):
                                break
                        await asyncio.sleep(0.5)
                    sizes, seconds = [], []
                    for _ in range(args.scrapes):
                        began = time.perf_counter()
                        status, body = await asyncio.to_thread(_get, base + "/metrics")
                        seconds.append(time.perf_counter() - began)
                        sizes.append(len(body))
                        await asyncio.sleep(1.1)  # past the cluster gauges' rate limit
                    families = list(text_string_to_metric_families(body.decode()))
                    samples = sum(len(f.samples) for f in families)
                    rss = rss_mb(proc.pid)
                finally:
                    stop_processes([proc], signal.SIGTERM)
        return {
            "MB per scrape": statistics.median(sizes) / 1e6,
            "samples per scrape": samples,
            "metric families": len(families),
            "scrape time, median": statistics.median(seconds) * 1000,
            "RSS after the scrapes": rss,
        }
    finally:
        await delete_stream(f"CLAIMD_{deployment}")


UNITS = {
    "MB per scrape": "MB",
    "samples per scrape": "samples",
    "metric families": "families",
    "scrape time, median": "ms",
    "RSS after the scrapes": "MB",
}


async def main(args: argparse.Namespace) -> None:
    print(await environment())
    print(f"{args.jobs} jobs (half every minute, half daily); {args.scrapes} scrapes each")
    default, aggregate = [await measure(label, on, args) for label, on in CONFIGS.items()]
    rows = [
        Row(name, aggregate[name], default[name], unit, higher_is_better=False)
        for name, unit in UNITS.items()
    ]
    print_table(
        "/metrics of one claimd run: job_histograms = false (figure) "
        "against the default, true (baseline)",
        rows,
        ["ratio > 1: smaller or faster than the default"],
    )
    if args.against is not None:
        before = await measure(args.against_label, None, args, args.against)
        rows = [
            Row(name, default[name], before[name], unit, higher_is_better=False)
            for name, unit in UNITS.items()
        ]
        print_table(
            f"/metrics at the defaults: this tree (figure) against {args.against_label} "
            "(baseline), same run",
            rows,
            ["ratio > 1: smaller or faster than the baseline"],
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="to get ready")
    parser.add_argument(
        "--against", type=Path, default=None, help="another source tree, at its defaults"
    )
    parser.add_argument("--against-label", default="the other tree")
    asyncio.run(main(parser.parse_args()))

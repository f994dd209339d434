"""Config at scale: load, validate, sync and reload of N jobs, and what a replica keeps.

For each size (``--jobs``, default 20,000 and 100,000: 10,000 ``* * * * *`` herd
jobs, the rest daily crons in several zones, every job an async python no-op,
as ``bench.bench_burst`` writes them) a fresh subprocess, on a schema of its
own, times:

- load: reading the file and ``tomllib`` (the baseline: TOML alone);
- validate: ``load_config`` whole (TOML + every job to a domain Job);
- sync: ``sync_jobs`` into an empty ``jobs`` table (all added);
- first read: the materializer's first catalog read (``active_jobs`` and one
  decoded Job per job, as ``Materializer`` keeps them; no plan written);
- scrape: one ``/metrics`` page rendered (the cluster gauges read first), its
  size, with the ``job_histograms`` the settings give;
- reload: ``load_config`` + ``sync_jobs`` again with nothing changed, as SIGHUP does;

and what the process holds once it is built as a replica builds it (the
config, the per-job series, the catalog's definitions, the materializer's
jobs): RSS above the same process before the config was read, per job, and
the baseline, a plain row per job (the TOML's own dict of each job). With
``--trace`` the same run under tracemalloc prints where the memory kept goes,
by file and line (tracemalloc slows everything: its times are not figures).

    python -m bench.bench_config_scale                      # 20,000 and 100,000 jobs
    python -m bench.bench_config_scale --jobs 100000 --trace
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
import time
import tomllib
import tracemalloc
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_burst import jobs_toml
from bench.common import (
    REPO,
    RESULT_MARKER,
    Row,
    bench_schema,
    child_env,
    config_toml,
    migrated_store,
    print_result,
    print_table,
)

HERD = 10_000


def _rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MB."""
    fields: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


async def measure(n_jobs: int, trace: bool) -> dict[str, Any]:
    """One size, in this process: the times, and what is kept."""
    from actors.config import load_config
    from actors.observability import init_job_series, init_series, per_job_histograms
    from actors.observability.exposition import render
    from actors.replica.cluster_reader import ClusterMetrics
    from actors.replica.reload import JobsConfig
    from actors.scheduling.database_clock import DatabaseClock
    from actors.scheduling.materializer import Materializer

    herd = min(HERD, n_jobs)
    result: dict[str, Any] = {"jobs": n_jobs}
    async with bench_schema("bench_cfg_") as schema_url, migrated_store(schema_url) as store:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "claimd.toml"
            path.write_text(
                config_toml(schema_url, "cfgscale", jobs_toml(herd, n_jobs - herd, seed=1))
            )
            gc.collect()
            rss_before, _ = _rss_mb()
            if trace:
                tracemalloc.start(1)

            began = time.perf_counter()
            raw = tomllib.loads(path.read_text())
            result["toml_s"] = time.perf_counter() - began
            del raw
            gc.collect()

            began = time.perf_counter()
            loaded = load_config(path)
            loaded.raise_for_errors()
            result["load_s"] = time.perf_counter() - began
            result["rss_after_load"] = _rss_mb()[0]

            jobs = JobsConfig(path, loaded, syncs_jobs=True)
            del loaded
            began = time.perf_counter()
            await jobs.sync_at_start(store, "bench")
            result["sync_s"] = time.perf_counter() - began
            result["rss_after_sync"] = _rss_mb()[0]

            init_series()
            by_job = bool(jobs.loaded.settings.job_histograms)
            if hasattr(jobs.loaded.settings, "histograms_by_job"):  # a baseline may not have it
                by_job = jobs.loaded.settings.histograms_by_job(len(jobs.jobs))
            per_job_histograms(by_job)
            init_job_series(jobs.jobs)
            result["job_histograms"] = by_job

            stop = asyncio.Event()
            materializer = Materializer(
                store,
                DatabaseClock(store),
                jobs.loaded.settings.horizon,
                jobs.loaded.settings.materialize_interval,
                stop,
            )
            began = time.perf_counter()
            await materializer._refresh_catalog()
            result["first_read_s"] = time.perf_counter() - began
            result["rss_after_first_read"] = _rss_mb()[0]

            cluster = ClusterMetrics(store.cluster_figures, timeout=120.0)
            began = time.perf_counter()
            await cluster.refresh()
            page = await asyncio.to_thread(render)
            result["scrape_s"] = time.perf_counter() - began
            result["rss_after_scrape"] = _rss_mb()[0]
            result["page_mb"] = sum(len(c) for c in page) / 1e6
            del page

            began = time.perf_counter()
            ok = await jobs.reload(store, "bench")
            result["reload_s"] = time.perf_counter() - began
            result["rss_after_reload"] = _rss_mb()[0]
            assert ok, "the reload was refused"

            gc.collect()
            rss_after, peak = _rss_mb()
            # What of it is free memory glibc's heap still holds (fragmentation).
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            result["rss_trimmed"] = _rss_mb()[0]
            result["rss_mb"] = rss_after
            result["kept_mb"] = rss_after - rss_before
            result["peak_mb"] = peak
            if trace:
                snapshot = tracemalloc.take_snapshot()
                tracemalloc.stop()
                stats = snapshot.statistics("lineno")
                result["traced_mb"] = sum(s.size for s in stats) / 1e6
                result["top"] = [
                    (str(s.traceback[0]).replace(str(REPO) + "/", ""), s.size, s.count)
                    for s in stats[:25]
                ]
            # What a plain row per job costs: the job's own TOML table.
            gc.collect()
            if not trace:
                tracemalloc.start(1)
            began_mem = tracemalloc.get_traced_memory()[0]
            rows = tomllib.loads(path.read_text())["jobs"]
            result["row_mb"] = (tracemalloc.get_traced_memory()[0] - began_mem) / 1e6
            tracemalloc.stop()
            del rows
            # Kept alive to here: they are what the replica holds.
            assert materializer is not None
            assert jobs is not None
            assert cluster is not None
    return result


def child(n_jobs: int, trace: bool) -> None:
    print_result(asyncio.run(measure(n_jobs, trace)))


def run_size(n_jobs: int, trace: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.bench_config_scale", "--child", str(n_jobs)]
    if trace:
        cmd.append("--trace")
    out = subprocess.run(
        cmd, cwd=REPO, env=child_env(), check=True, capture_output=True, text=True
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith(RESULT_MARKER))
    result: dict[str, Any] = json.loads(line.removeprefix(RESULT_MARKER))
    return result


def report(r: dict[str, Any]) -> None:
    n = r["jobs"]
    kb = 1e3 / n
    rows = [
        Row("load + validate", r["load_s"], r["toml_s"], "s (baseline: TOML alone)", False),
        Row("sync (all added)", r["sync_s"], None, "s", False, compared=False),
        Row("first catalog read", r["first_read_s"], None, "s", False, compared=False),
        Row("one /metrics scrape", r["scrape_s"], None, "s", False, compared=False),
        Row("/metrics page", r["page_mb"], None, "MB", False, compared=False),
        Row("reload (nothing changed)", r["reload_s"], None, "s", False, compared=False),
        Row("RSS after start + reload", r["rss_mb"], None, "MB", False, compared=False),
        Row("peak RSS", r["peak_mb"], None, "MB", False, compared=False),
        Row(
            "kept per job (RSS)",
            r["kept_mb"] * kb,
            r["row_mb"] * kb,
            "KB (baseline: TOML row)",
            False,
        ),
    ]
    stages = ("load", "sync", "first_read", "scrape", "reload")
    notes = [
        "RSS after each step (MB): "
        + ", ".join(f"{s} {r['rss_after_' + s]:.0f}" for s in stages)
        + f" (before the config: {r['rss_mb'] - r['kept_mb']:.0f};"
        f" after malloc_trim: {r['rss_trimmed']:.0f})"
    ]
    notes += [f"job_histograms = {str(r['job_histograms']).lower()} (the default at this size)"]
    if "top" in r:
        notes.append(f"traced while kept: {r['traced_mb']:.1f} MB; largest by line:")
        notes += [f"  {size / 1e6:8.1f} MB {count:>9,}  {where}" for where, size, count in r["top"]]
    print_table(f"{n:,} jobs ({min(HERD, n):,} every minute, the rest daily)", rows, notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--trace", action="store_true", help="tracemalloc: where memory goes")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.trace)
        return
    for n_jobs in args.jobs:
        report(run_size(n_jobs, args.trace))


if __name__ == "__main__":
    main()

"""What bench_burst's herd runs, the floor it is measured against, and the CPU it reads.

Every herd job notes the moment its own code began, as ``<job> <epoch>`` lines
in one file: python jobs append ``time.time()`` (``began`` in a child of the
fork server, ``abegan`` on the replica's job loops), shell jobs run
``bash -c 'echo <job> $(date +%s.%N) >> file'``, http jobs call a local
aiohttp server (``serve``, a process of its own) that notes each arrival.

The floor (``floor``): the same callables, commands or requests started at one
instant by a plain program with no scheduler, database or broker: shell
commands by plain asyncio (``create_subprocess_exec``, a semaphore of
``--concurrency``), sync functions by a thread pool of that size (``sync``) or by
a process pool of that size, its processes started before the instant
(``sync-process``: the floor of sync functions run in processes, as claimd runs
them so that an attempt past its timeout can be killed), async ones as tasks of
one loop, requests by one aiohttp session with that many connections.

    python -m bench.burst_jobs serve PORT FILE
    python -m bench.burst_jobs floor KIND COUNT AT FILE [--concurrency 64] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import resource
import sys
import time
from collections.abc import Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import psutil

BEGAN_ENV = "BURST_BEGAN"
KINDS = ("async", "sync", "shell", "http")
FLOOR_KINDS = (*KINDS, "sync-process")


def _note(job: str, path: str | None = None) -> None:
    line = f"{job} {time.time():.6f}\n".encode()
    fd = os.open(path or os.environ[BEGAN_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def began(ctx: object) -> None:
    """A sync python job: notes when its code began."""
    _note(_tagged(ctx))


async def abegan(ctx: object) -> None:
    """An async python job: notes when its code began."""
    _note(_tagged(ctx))


def _tagged(ctx: object) -> str:
    """``job@instant`` (epoch seconds), or the bare job name when the caller has no instant."""
    job, at = str(getattr(ctx, "job", "floor")), getattr(ctx, "scheduled_at", None)
    return f"{job}@{at.timestamp():.3f}" if at is not None else job


def instant_of(tag: str) -> float | None:
    """The instant a ``job@instant`` tag names (epoch seconds or ISO 8601), if any."""
    _, sep, at = tag.partition("@")
    if not sep:
        return None
    with contextlib.suppress(ValueError):
        return float(at)
    try:
        return datetime.fromisoformat(at).timestamp()
    except ValueError:
        return None


def shell_argv(file: Path) -> list[str]:
    """The shell job's argv (``{job}`` is filled by claimd's templating)."""
    return ["bash", "-c", f"echo {{job}}@{{scheduled_at}} $(date +%s.%N) >> {file}"]


def run_toml(kind: str, file: Path, url: str) -> str:
    """The ``run =`` value of a herd job of ``kind``."""
    if kind == "async":
        return '{ python = "bench.burst_jobs:abegan" }'
    if kind == "sync":
        return '{ python = "bench.burst_jobs:began" }'
    if kind == "shell":
        return "{ shell = [" + ", ".join(f'"{a}"' for a in shell_argv(file)) + "] }"
    if kind == "http":
        return f'{{ http = {{ url = "{url}/began/{{job}}", method = "POST" }} }}'
    raise ValueError(kind)


def read_began(file: Path) -> list[tuple[str, float]]:
    if not file.exists():
        return []
    out = []
    for line in file.read_text().splitlines():
        job, _, at = line.partition(" ")
        if at:
            out.append((job, float(at)))
    return out


# --- CPU of the processes at the instant -------------------------------------------------


def _cpu(p: psutil.Process, own: bool = False) -> float:
    try:
        t = p.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return t.user + t.system if own else t.user + t.system + t.children_user + t.children_system


def _tree(pids: Iterable[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            out += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return out


def client_ports(pids: Iterable[int], server_port: int = 5432) -> list[int]:
    """The local ports of the given processes' (and descendants') connections to the database."""
    ports = []
    for p in _tree(pids):
        try:
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        ports += [c.laddr.port for c in conns if c.raddr and c.raddr.port == server_port]
    return ports


def cpu_sample(pids: Iterable[int], backends: Iterable[int] = ()) -> dict[str, dict[int, float]]:
    """CPU seconds so far by group: the given processes and their descendants
    (reaped children included), their PostgreSQL ``backends`` (by pid), every
    ``postgres`` process (the server is shared) and every ``nats-server``."""
    out: dict[str, dict[int, float]] = {
        "claimd": {},
        "jobs": {},
        "backends": {},
        "postgres": {},
        "nats": {},
    }
    roots = set(pids)
    for p in _tree(roots):
        # claimd: the replicas' own CPU; jobs: their descendants' and every reaped child's.
        own, whole = _cpu(p, own=True), _cpu(p)
        if p.pid in roots:
            out["claimd"][p.pid] = own
            out["jobs"][p.pid] = whole - own
        else:
            out["jobs"][p.pid] = whole
    for pid in backends:
        with contextlib.suppress(psutil.NoSuchProcess):
            out["backends"][pid] = _cpu(psutil.Process(pid))
    for p in psutil.process_iter(["name"]):
        name = p.info["name"] or ""
        group = (
            "postgres" if name.startswith("postgres") else "nats" if name == "nats-server" else None
        )
        if group:
            out[group][p.pid] = _cpu(p)
    return out


def cpu_delta(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
) -> dict[str, float]:
    """Seconds of CPU each group spent between two samples (a process born between them: all
    of its own; one gone before the second: what it had, lost, unless its parent reaped it)."""
    return {
        group: sum(t - before[group].get(pid, 0.0) for pid, t in after[group].items())
        for group in after
    }


# --- the recording server and the floor --------------------------------------------------


async def serve(port: int, file: str) -> None:
    from aiohttp import web

    async def arrived(request: web.Request) -> web.Response:
        _note(request.match_info["job"], file)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/began/{job}", arrived)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("serving", flush=True)
    await asyncio.Event().wait()


async def floor(kind: str, count: int, at: float, file: str, concurrency: int, url: str) -> None:
    """Start ``count`` of the herd's work at epoch ``at``, ``concurrency`` at a time."""
    jobs = [f"floor-{os.getpid()}-{i:06d}" for i in range(count)]
    sem = asyncio.Semaphore(concurrency)
    session = None
    if kind == "http":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
    os.environ[BEGAN_ENV] = file  # before a process pool forks
    pool: Executor | None = None
    if kind == "sync":
        pool = ThreadPoolExecutor(concurrency)
    elif kind == "sync-process":
        pool = ProcessPoolExecutor(concurrency, mp_context=multiprocessing.get_context("fork"))
    loop = asyncio.get_running_loop()
    if kind == "sync-process":  # every process started (and warm) before the instant
        assert pool is not None
        await asyncio.gather(*(loop.run_in_executor(pool, os.getpid) for _ in range(concurrency)))

    async def shell(job: str) -> None:
        async with sem:
            # No instant to name: the floor's lines are placed by time.
            argv = [
                a.replace("{job}", job).replace("@{scheduled_at}", "")
                for a in shell_argv(Path(file))
            ]
            proc = await asyncio.create_subprocess_exec(*argv)
            await proc.wait()

    async def http(job: str) -> None:
        assert session is not None
        async with session.post(f"{url}/began/{job}") as reply:
            await reply.read()

    cpu0 = _own_cpu()
    contexts = [SimpleNamespace(job=job) for job in jobs]
    await asyncio.sleep(max(0.0, at - time.time()))
    if kind == "async":
        await asyncio.gather(*(asyncio.create_task(abegan(ctx)) for ctx in contexts))
    elif kind in ("sync", "sync-process"):
        await asyncio.gather(*(loop.run_in_executor(pool, began, ctx) for ctx in contexts))
    elif kind == "shell":
        await asyncio.gather(*(shell(job) for job in jobs))
    else:
        await asyncio.gather(*(http(job) for job in jobs))
        assert session is not None
        await session.close()
    if pool is not None:
        pool.shutdown()
    own, children = _own_cpu()
    print(f"cpu {own - cpu0[0]:.6f} {children - cpu0[1]:.6f}", flush=True)


def _own_cpu() -> tuple[float, float]:
    """CPU seconds so far of this process, and of its reaped children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve")
    s.add_argument("port", type=int)
    s.add_argument("file")
    f = sub.add_parser("floor")
    f.add_argument("kind", choices=FLOOR_KINDS)
    f.add_argument("count", type=int)
    f.add_argument("at", type=float)
    f.add_argument("file")
    f.add_argument("--concurrency", type=int, default=64)
    f.add_argument("--url", default="")
    args = p.parse_args(argv)
    if args.what == "serve":
        asyncio.run(serve(args.port, args.file))
    else:
        asyncio.run(floor(args.kind, args.count, args.at, args.file, args.concurrency, args.url))


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()

"""How a shell job's process is started: its own session and group, its marker, no thread."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from actors.adapters.executors.process_tree import MARKER
from actors.adapters.executors.spawn import PIDFD, Process, spawn

pytestmark = pytest.mark.skipif(not PIDFD, reason="the pidfd watch is Linux 5.3+ only")


async def _started(
    argv: list[str], env: dict[str, str], use_shell: bool = False
) -> tuple[Process, int]:
    read_fd, write_fd = os.pipe()
    try:
        proc = await spawn(argv, use_shell=use_shell, env=env, cwd=None, output=write_fd)
    finally:
        os.close(write_fd)
    return proc, read_fd


async def test_the_child_leads_its_own_group_carries_the_marker_and_needs_no_thread() -> None:
    threads = {t.ident for t in threading.enumerate()}
    proc, read_fd = await _started(
        ["/bin/sh", "-c", "exec sleep 300"], {"PATH": os.defpath, MARKER: "m-1"}
    )
    try:
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getsid(proc.pid) == proc.pid
        # Read until the shell's exec of sleep is over (while a process execs, its
        # environ reads empty): a poll with a deadline.
        environ: list[bytes] = []
        async with asyncio.timeout(10):
            while f"{MARKER}=m-1".encode() not in environ:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:  # noqa: ASYNC230 - procfs
                    environ = f.read().split(b"\0")
                if f"{MARKER}=m-1".encode() not in environ:
                    await asyncio.sleep(0.005)
        # asyncio's own subprocess would wait for it in a thread started per child.
        assert {t.ident for t in threading.enumerate()} <= threads
        assert proc.returncode is None
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        os.close(read_fd)
    async with asyncio.timeout(30):
        assert await proc.wait() == -signal.SIGKILL
    assert proc.returncode == -signal.SIGKILL


async def test_a_cancelled_wait_leaves_the_exit_to_the_next_wait() -> None:
    proc, read_fd = await _started(["exit 3"], {"PATH": os.defpath}, use_shell=True)
    os.close(read_fd)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(proc.wait(), 0)
    async with asyncio.timeout(30):
        assert await proc.wait() == 3


async def test_a_program_that_does_not_exist_is_an_os_error() -> None:
    with pytest.raises(OSError):
        await _started(["/nonexistent/program"], {"PATH": os.defpath})

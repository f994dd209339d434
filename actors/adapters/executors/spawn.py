"""A shell job's process, started the cheapest way that keeps its group and environment.

asyncio's subprocess (Python 3.11) watches each child with a thread of its
own (``ThreadedChildWatcher``: one thread started per process, blocked in
``waitpid``), which about doubles the replica's CPU per spawn in a herd of
shell jobs. Here the child is created by ``subprocess.Popen`` on CPython's
``vfork`` path (no ``preexec_fn``, no uid, gid or group change), with
``start_new_session`` (the child leads its own session and process group, so
the group can be killed whole), ``close_fds`` (none of claimd's descriptors
reach the job) and the job's own environment (the process tree's marker
included). ``posix_spawn`` is no cheaper here and CPython takes it only
without ``start_new_session``, ``close_fds`` and ``cwd``, which a job needs.

Its exit is watched on the event loop through a pidfd (Linux 5.3+): no thread
and no SIGCHLD handler, and the pid stays ours (a zombie) until it is reaped
here, so a signal sent by pid never reaches a reused pid. Where ``pidfd_open``
is missing (macOS, older kernels) asyncio's subprocess is used as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from typing import Protocol


class Process(Protocol):
    """What the shell executor needs of a started job: asyncio's Process has it too."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


def _pidfd_works() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


PIDFD = _pidfd_works()


class Child:
    """A process started by ``Popen`` whose exit the running loop sees through its pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._popen = popen
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        loop.add_reader(self._pidfd, self._reap)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def _reap(self) -> None:
        code = self._popen.poll()  # waitpid(WNOHANG); -N for signal N, as asyncio gives
        if code is None:
            return
        self._close()
        if not self._exited.done():
            self._exited.set_result(code)

    def _close(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def wait(self) -> int:
        """The exit code; a cancelled wait leaves the watch in place for the next one."""
        return await asyncio.shield(self._exited)


async def spawn(
    argv: list[str], *, use_shell: bool, env: dict[str, str], cwd: str | None, output: int
) -> Process:
    """Start ``argv`` (or ``argv[0]`` through ``/bin/sh -c``) as its own session's leader.

    stdin is /dev/null, stdout and stderr go to ``output``. Raises OSError when
    the program cannot be started.
    """
    if not PIDFD:
        if use_shell:
            return await asyncio.create_subprocess_shell(
                argv[0], stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                env=env, cwd=cwd, start_new_session=True,
            )  # fmt: skip
        return await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    # Popen returns once the child has exec'd (vfork): as long as asyncio's own spawn blocks.
    popen = subprocess.Popen(  # noqa: ASYNC220
        argv[0] if use_shell else argv,
        shell=use_shell,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
    )
    try:
        return Child(popen, asyncio.get_running_loop())
    except OSError:  # no pidfd after all (descriptors exhausted): wait in a thread
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        await asyncio.to_thread(popen.wait)
        raise

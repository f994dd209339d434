"""A shell job's whole process tree, found without cgroups, and ended.

The job's process group is not its tree: ``setsid`` (or a daemon's double
fork) leaves the group, and once the leader is gone such a process belongs to
init. So each execution carries a marker in its environment
(``CLAIMD_PROCESS_TREE``, inherited by every descendant that does not clear
its environment), and the tree is, on Linux, every process that carries the
marker plus every descendant of the leader (by parent pid) while the leader
lives. Elsewhere (no ``/proc``) the tree is the process group alone.

Read at timeout and at cancellation only: a scan of ``/proc`` costs a few
milliseconds, too much for every run's end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

MARKER = "CLAIMD_PROCESS_TREE"
_PROC = Path("/proc")
# A tree that forks while it is killed is scanned again, this many times at most.
_ROUNDS = 5


def new_marker() -> str:
    """A value of ``CLAIMD_PROCESS_TREE`` no other execution has."""
    return uuid.uuid4().hex


def _parent_of(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _carries(pid: int, entry: bytes) -> bool:
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return entry in b"\0" + environ + b"\0"


def members(leader: int | None, marker: str) -> set[int]:
    """The pids of the tree: the marker's carriers and the leader's descendants.

    ``leader``: None once the leader is reaped (its pid may be another's by then).
    """
    if not _PROC.is_dir():
        return set()
    entry = b"\0" + f"{MARKER}={marker}".encode() + b"\0"
    me = os.getpid()
    parents: dict[int, int] = {}
    found: set[int] = set()
    for child in _PROC.iterdir():
        if not child.name.isdigit():
            continue
        pid = int(child.name)
        if pid == me:
            continue
        parent = _parent_of(pid)
        if parent is None:
            continue
        parents[pid] = parent
        if _carries(pid, entry):
            found.add(pid)
    # The leader's descendants, by parent pid (those that cleared their environment).
    tree = set() if leader is None else {leader}
    grew = bool(tree)
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    found |= tree & set(parents)
    found.discard(me)
    return found


def kill_tree(leader: int | None, marker: str) -> int:
    """SIGKILL every process of the tree, again while it keeps forking; how many were hit."""
    killed: set[int] = set()
    for _ in range(_ROUNDS):
        pids = members(leader, marker) - killed
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
    return len(killed)


def signal_tree(leader: int | None, marker: str, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of the tree once (the polite first step)."""
    for pid in members(leader, marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)

"""What a warm child sets again before each attempt, whatever the last one did: cheaply.

A warm child (``warm_child.py``) runs attempt after attempt of any sync job.
Each attempt starts from exactly: the environment the worker sent plus the
run's ``CLAIMD_*`` variables; ``sys.stdout`` and ``sys.stderr`` on fds 1 and 2,
line-buffered, and the root logger writing ``log_context.FORMAT`` lines to
stderr at INFO; the default handlers of the signals in :data:`RESET` and no
alarm pending. Setting all of it anew took a child 75-90 µs per attempt
(``bench/bench_warm_child.py --steps``: the environment 40-54, the streams and
logger 22-28, the signals 9-10), about 40 % of its CPU on a no-op: each piece
is now compared with what was set for the last attempt, exactly, and set
again only where that attempt changed it (the signals excepted: python's own
table does not show a handler a C library set, so they are set each time).

Standard library only (and ``log_context``, which is): this runs in the fork
server's children.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
from typing import Any

from actors.adapters.executors import log_context


class Output(io.TextIOWrapper):
    """sys.stdout or sys.stderr of an attempt. Its newline setting cannot be read back, so a
    ``reconfigure`` marks it (an attribute: it then has some): the next attempt gets a new one."""

    def reconfigure(self, *args: Any, **kwargs: Any) -> None:
        self.reconfigured = True
        super().reconfigure(*args, **kwargs)


def _output(fd: int) -> Output:
    # Line-buffered: a kill loses at most a partial line.
    raw = io.FileIO(fd, "w", closefd=False)
    return Output(raw, line_buffering=True, errors="backslashreplace")


def _untouched(stream: Any, ours: Output | None) -> bool:
    """The stream set for the last attempt, as it was set (not closed, not detached, no
    attribute of its own: not reconfigured, no method replaced)."""
    if ours is None or stream is not ours:
        return False
    try:
        return not vars(ours) and not ours.closed
    except ValueError:  # detached
        return False


class Streams:
    """sys.stdout and sys.stderr on fds 1 and 2, line-buffered, and the root logger writing
    to stderr (``log_context.FORMAT``, INFO), for each attempt, whatever the last one did.

    What the last attempt left is kept only when it is exactly what was set: the
    same objects, not closed, not reconfigured, no attribute of theirs changed.
    Anything else, and all of it is made anew: new objects cost more than the
    checks (new handlers, and the level, which empties every logger's cache).
    """

    def __init__(self) -> None:
        self.out: Output | None = None
        self.err: Output | None = None
        self.handler: logging.StreamHandler[Any] = logging.StreamHandler()
        self.handlers: list[logging.Handler] = []
        self.state: tuple[dict[str, Any], ...] = ()

    def set(self) -> None:
        try:
            kept = self._kept()
        except Exception:  # noqa: BLE001 - what a job left may be anything (no sys.stdout)
            kept = False
        if not kept:
            self._renew()

    def _kept(self) -> bool:
        root, handler = logging.getLogger(), self.handler
        formatter = handler.formatter
        return (
            _untouched(sys.stdout, self.out)
            and _untouched(sys.stderr, self.err)
            and root.handlers is self.handlers
            and len(root.handlers) == 1
            and root.handlers[0] is handler
            and root.level == logging.INFO
            and not root.filters
            and not root.disabled
            and not handler.filters
            and formatter is not None
            and (vars(handler), vars(formatter), vars(formatter._style)) == self.state
        )

    def _renew(self) -> None:
        sys.stdout = self.out = _output(1)
        sys.stderr = self.err = _output(2)
        self.handler = handler = logging.StreamHandler(sys.stderr)
        formatter = logging.Formatter(log_context.FORMAT)
        handler.setFormatter(formatter)
        root = logging.getLogger()
        root.handlers = self.handlers = [handler]
        root.filters, root.disabled = [], False
        root.setLevel(logging.INFO)
        self.state = (dict(vars(handler)), dict(vars(formatter)), dict(vars(formatter._style)))


class Environment:
    """The attempt's environment: the base the worker sent (once per version) plus the
    run's ``CLAIMD_*`` variables, set afresh whatever the last attempt did to ``os.environ``.

    ``os.environ`` decodes every entry when compared or copied (20 µs and more):
    what this process holds is compared in its encoded form instead
    (``os.environ._data``, a dict of bytes), with a copy taken when it was last
    set. Untouched since, only the variables of the last run and of this one
    can differ, and only those that do are set (``putenv``); touched (or
    rebound), it is made whole again, entry by entry. A job's own ``os.putenv``
    (not through ``os.environ``) is not seen, as it was not before.
    """

    def __init__(self) -> None:
        self.environ = os.environ
        self.base: dict[str, str] = {}
        self.run: dict[str, str] = {}
        self.left: dict[bytes, bytes] | None = None  # _data as the last set left it

    def set(self, base: dict[str, str] | None, run: dict[str, str]) -> None:
        if base is not None:
            self.base, self.left = base, None
        environ = self.environ
        data = getattr(environ, "_data", None)
        rebound = getattr(os, "environ", None) is not environ  # (or deleted)
        if self.left is not None and not rebound and data == self.left:
            last = self.run
            for key in last.keys() | run.keys():
                value = run.get(key, self.base.get(key))
                if value == last.get(key, self.base.get(key)):
                    continue
                if value is None:
                    del environ[key]
                else:
                    environ[key] = value
        else:
            # A job may have put another mapping in its place: ours is the process's.
            os.environ = environ  # noqa: B003
            wanted = {**self.base, **run}
            current = dict(environ)
            for key in current.keys() - wanted.keys():
                del environ[key]
            for key, value in wanted.items():
                if current.get(key) != value:
                    environ[key] = value
            data = getattr(environ, "_data", None)
        self.run = run
        self.left = None if data is None else dict(data)


RESET = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGALRM)


def default_signals() -> None:
    """Whatever handlers the last attempt installed, this one starts from the defaults
    (a SIGTERM at its timeout ends it at once; an alarm the last one set is gone)."""
    signal.alarm(0)
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)

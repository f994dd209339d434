"""The operator's commands, listed once: a new command is one line in ``register``.

Each group lives in its own module: the reads (``reads.py``), the actions
(``actions.py``), the reload of a running replica (``reload.py``); what they
share, the connection options and how a command runs, in ``options.py`` and
``running.py``.
"""

from __future__ import annotations

from typing import Any

from actors.cli.operator import actions, logs, reads, reload
from actors.cli.operator.connect import StoreOpener
from actors.cli.operator.options import Commands
from actors.cli.operator.running import EXIT_CODES, OneLineParser

__all__ = ["EXIT_CODES", "OneLineParser", "register"]


def register(sub: Any, open_store: StoreOpener) -> None:
    """Add the operator's commands to the `claimd` parser, in the order `claimd --help` lists them.

    ``open_store`` opens the operator's store on a database URL: the adapter is
    named by the caller (the composition root), never here.
    """
    commands = Commands(sub, open_store)
    reads.add_jobs(commands)
    reads.add_runs(commands)
    reads.add_show(commands)
    reads.add_audit(commands)
    reads.add_actions(commands)
    actions.add_pause(commands)
    actions.add_resume(commands)
    actions.add_trigger(commands)
    actions.add_cancel(commands)
    actions.add_backfill(commands)
    reload.add_reload(commands)
    logs.add_logs(commands)

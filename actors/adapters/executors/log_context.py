"""A python job's log records name their run: ``record.claimd_job`` and
``record.claimd_run_id`` on every record made while the job runs.

A job that logs with :mod:`logging` gets these attributes on each record, for
its own handlers and formatters too (a JSON logger shipping to a log store can
add them); claimd's own capture writes them in every line of the attempt's
output (:data:`FORMAT`). Where no job runs, both are ``"-"``.

An async job's run is a context variable, set in the task that runs it (so two
jobs on one job loop keep theirs apart). A sync job runs alone in its warm
child, so the child's run is a process-wide value, which the threads the job
starts see too.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

FORMAT = "%(levelname)s %(name)s job=%(claimd_job)s run_id=%(claimd_run_id)s: %(message)s"
NO_RUN = ("-", "-")

RUN: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "claimd_job_run", default=None
)
_process_run: tuple[str, str] = NO_RUN
_installed = False


def set_process_run(job: str, run_id: str) -> None:
    """The run a warm child executes now (a sync job: one at a time per process)."""
    global _process_run
    _process_run = (job, run_id)


def install() -> None:
    """Every record made in this process carries its run (idempotent)."""
    global _installed
    if _installed:
        return
    make = logging.getLogRecordFactory()

    def with_run(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        job, run_id = RUN.get() or _process_run
        record.claimd_job = job
        record.claimd_run_id = run_id
        return record

    logging.setLogRecordFactory(with_run)
    _installed = True

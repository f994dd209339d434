"""Executors: shell, python and http. Each runs one attempt and reports.

None raises for a failing job.

Errors are caught at the edge of each run, never allowed to reach the loop
that runs the next one. Cancellation (shutdown, a lost lease) is cleaned up
after (the process group killed) and re-raised.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from actors.adapters.executors.common import (
    OUTPUT_TAIL_BYTES,
    MissingSecret,
    resolve_secrets,
    scrub,
)
from actors.adapters.executors.http import run_http
from actors.adapters.executors.python import (
    PythonRunner,
    resolve_callable,
    run_python,
)
from actors.adapters.executors.shell import run_shell
from actors.domain import (
    ExecutionResult,
    ExecutorSpec,
    PythonSpec,
    RunContext,
    ShellSpec,
    defaults,
)


class LocalExecutor:
    """Executor port: dispatches on the spec's kind.

    ``withheld_env``: variables of claimd's environment, besides its own
    ``CLAIMD_*`` settings, that python jobs do not get (the API token's).
    """

    def __init__(
        self, withheld_env: Iterable[str] = (), python_processes: int = defaults.PYTHON_PROCESSES
    ) -> None:
        """``python_processes``: the warm child processes kept for sync python attempts."""
        self.python = PythonRunner(withheld_env, processes=python_processes)

    async def execute(
        self, spec: ExecutorSpec, context: RunContext, timeout: timedelta
    ) -> ExecutionResult:
        # Each kind masks its own secrets; this masks every secret the replica
        # knows (another job's, the tokens, the database password) in what any
        # kind reports, a python job's traceback included.
        if isinstance(spec, ShellSpec):
            return scrub(await run_shell(spec, context, timeout))
        if isinstance(spec, PythonSpec):
            return scrub(await self.python.run(spec, context, timeout))
        return scrub(await run_http(spec, context, timeout))

    async def close(self) -> None:
        """End the python fork server and its warm children (Closing), at a stop."""
        await self.python.close()

    def runs_inline(self, executor: str | None) -> bool:
        """Whether runs of that kind (a dispatch's ``executor`` hint) take the inline pool of
        slots (``worker_async_concurrency``) rather than a process slot.

        Python runs do: an async callable runs on the job loop, a sync one waits
        for a warm child of the pool (``python_processes`` bounds how many run at
        once), so a herd of sync no-ops is started at its instant in a few
        statements instead of one process slot's worth at a time. Shell takes a
        process and http a connection: those take the worker's slots.
        """
        return executor is not None and executor.startswith("python:")

    def prepare(self, executor: str | None, count: int = 1) -> None:
        """``count`` runs of that kind are held for their instant: make ready what they
        need before it comes (a sync python job's warm child processes)."""
        if executor is not None and executor.startswith("python:"):
            self.python.warm(executor.removeprefix("python:"), count)


__all__ = [
    "OUTPUT_TAIL_BYTES",
    "LocalExecutor",
    "MissingSecret",
    "PythonRunner",
    "resolve_callable",
    "resolve_secrets",
    "run_http",
    "run_python",
    "run_shell",
    "scrub",
]

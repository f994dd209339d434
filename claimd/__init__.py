"""Declare claimd jobs in Python: ``@claimd.job(every="5m")`` above a function.

    import claimd

    @claimd.job(cron="0 2 * * *", timezone="Europe/Berlin", max_attempts=3)
    def nightly_export(ctx):          # sync or async; ctx.run_id is the idempotency key
        ...

The config file names the modules that declare jobs (``modules = ["billing.jobs"]``
in its ``[claimd]`` table). Importing a module only records its declarations
here: each is a plain dict of the same keys a ``[jobs.NAME]`` table takes, with
``run = { python = "module:function" }``, and claimd's config loader validates
it as it validates a TOML job (the same checks, the errors naming
``module:function`` and the field). This module imports nothing of claimd's
internals: a job module stays cheap to import and to test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

__all__ = ["Declaration", "declared_in", "job"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Declaration:
    """One decorated function: the job's name, its keys as a TOML table would hold them."""

    name: str
    module: str
    function: str  # its __qualname__: a module-level function's name
    keys: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"{self.module}:{self.function}"


# Module name -> its declarations in order, as recorded by its last import.
_DECLARED: dict[str, list[Declaration]] = {}


def declared_in(module: str) -> list[Declaration]:
    """What ``module`` declared when it was last imported (nothing if it declared nothing)."""
    return list(_DECLARED.get(module, ()))


def forget(module: str) -> list[Declaration]:
    """Drop ``module``'s declarations (before it is imported again); what it had."""
    return _DECLARED.pop(module, [])


def restore(module: str, declarations: list[Declaration]) -> None:
    """Put back what ``module`` declared before an import of it that failed."""
    _DECLARED[module] = list(declarations)


def _as_text(value: Any) -> Any:
    """A timedelta as the config file writes a duration ("1500ms"); anything else as given."""
    if isinstance(value, timedelta):
        return f"{round(value.total_seconds() * 1000)}ms"
    if isinstance(value, dict):
        return {k: _as_text(v) for k, v in value.items()}
    return value


def job(
    *,
    cron: str | None = None,
    every: str | timedelta | None = None,
    timezone: str | None = None,
    timeout: str | timedelta | None = None,
    max_attempts: int | None = None,
    enabled: bool | None = None,
    overlap: str | None = None,
    catchup: str | None = None,
    catchup_window: str | timedelta | None = None,
    starting_deadline: str | timedelta | None = None,
    jitter: str | timedelta | None = None,
    backoff: dict[str, Any] | None = None,
    name: str | None = None,
    **other: Any,
) -> Callable[[F], F]:
    """Declare the decorated function (sync or async, called with the run's context) a job.

    The keys are those of a ``[jobs.NAME]`` table, with the same defaults (a
    key left out is the table's default); durations are text with a unit
    ("30s", "15m") or a ``timedelta``. ``name`` defaults to the function's
    name. Keys a later claimd knows pass through ``other``; a key it does not
    know is refused by the loader, as in the file. Nothing is checked here:
    the loader checks and names ``module:function`` and the field.
    """
    given = {
        "cron": cron,
        "every": every,
        "timezone": timezone,
        "timeout": timeout,
        "max_attempts": max_attempts,
        "enabled": enabled,
        "overlap": overlap,
        "catchup": catchup,
        "catchup_window": catchup_window,
        "starting_deadline": starting_deadline,
        "jitter": jitter,
        "backoff": backoff,
        **other,
    }
    keys = {k: _as_text(v) for k, v in given.items() if v is not None}

    def declare(func: F) -> F:
        module = func.__module__
        qualname = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        table = {**keys, "run": {"python": f"{module}:{qualname}"}}
        job_name = name if name is not None else getattr(func, "__name__", qualname)
        _DECLARED.setdefault(module, []).append(Declaration(job_name, module, qualname, table))
        return func

    return declare

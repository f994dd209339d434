"""A replica run as this process: its config loaded, run to its end, its exit status.

Shared by `claimd run` and `claimd dev` (actors.cli.main, actors.cli.dev) and by
the chaos harness's broken builds, which compose replicas of their own.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

from actors.adapters.nats import StreamSettingsRefused
from actors.config import ConfigError, LoadedConfig, load_config
from actors.http.server import PortUnavailable
from actors.observability import get_logger, redact
from actors.observability.tracing import configure as configure_tracing
from actors.replica import Replica, Role
from actors.scheduling.supervisor import ActorGaveUp

log = get_logger("cli")


def load_or_exit(path: str) -> LoadedConfig:
    """The config at ``path``, or its error in one line and exit status 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def start_replica(
    path: Path,
    loaded: LoadedConfig,
    role: Role,
    on_http: Callable[[str, int], None] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """A replica of ``role`` on this config, run to its end: its exit status."""
    return run_replica(Replica(path, loaded, role, on_http=on_http, config_env=env))


def run_replica(replica: Replica) -> int:
    """Run ``replica`` to its end; its exit status, every failure logged as one line.

    Public so that another entry point composing its own replica (the chaos
    harness's broken builds, on adapters of its own) stops and exits exactly
    as `claimd run` does.
    """
    tracer = configure_tracing(replica.config.settings.tracing)
    try:
        return _run_to_end(replica)
    finally:
        tracer.shutdown()  # the spans still buffered are exported


def _run_to_end(replica: Replica) -> int:
    try:
        asyncio.run(replica.run())
    except StreamSettingsRefused as exc:
        log.error("stopping: the servers refuse these settings", error=str(exc))
        return 2
    except PortUnavailable as exc:
        log.error("stopping: the HTTP port cannot be served", error=exc.strerror)
        return 2
    except (ExceptionGroup, ActorGaveUp, OSError) as exc:
        failures = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        for failure in failures:
            what = (
                "an actor gave up"
                if isinstance(failure, ActorGaveUp)
                else "a server is unreachable or failed"
            )
            log.error(f"stopping: {what}", error=redact(repr(failure)))
        return 1
    except Exception as exc:  # logged: one JSON line with the traceback, not raw lines
        log.error("stopping: unexpected error", error=redact(repr(exc)), exc_info=True)
        return 1
    return 1 if replica.forced_stop else 0


def write_pid_file(path: str | None) -> None:
    """This process's pid in ``path`` (for `claimd reload --pid-file`), when one is given."""
    if path:
        Path(path).write_text(f"{os.getpid()}\n")

"""How an operator command runs: its backend opened and closed, each error one line, its exit.

Exit status (the same for every command):
  0  done; the audit is complete
  1  failed or incomplete: the audit found a missing, failed or stuck run, or a run
     not finished yet, or the range names no instant of the schedule; the replica
     refused a reload; trigger --wait: the run ended other than succeeded
  2  usage or bad input: a bad time (a trigger or a backfill of an instant after now),
     run id, state, range, URL, token or config file (reload --config: one the replica
     would refuse)
  3  nothing to do, or not found: no such job or run; the run is already finished;
     the instant already has a run (a backfill: every instant of the range); the
     job is already paused
  4  claimd unreachable: the database or the API did not answer
  5  trigger --wait gave up waiting (--wait-timeout); the run goes on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from actors.cli.operator import render
from actors.cli.operator.connect import Backend, open_backend
from actors.operator import OperatorError, Unavailable
from actors.ports import SchemaMissing, StoreRefused, StoreUnavailable

EXIT_CODES = __doc__.split("Exit status", 1)[1] if __doc__ else ""
Result = tuple[Any, str, int]
Command = Callable[[Backend, argparse.Namespace], Awaitable[Result]]


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line (and exit status 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def fail(message: str, code: int) -> int:
    """One ``error:`` line on stderr, safe for a terminal; ``code``."""
    print(f"error: {render.terminal_safe(' '.join(message.split()))}", file=sys.stderr)
    return code


def _fail(exc: BaseException, code: int) -> int:
    return fail(str(exc).strip() or type(exc).__name__, code)


async def _run(command: Command, args: argparse.Namespace) -> int:
    try:
        backend = await open_backend(args)
    except OperatorError as exc:
        return _fail(exc, exc.exit)
    try:
        payload, text, code = await command(backend, args)
    except OperatorError as exc:
        return _fail(exc, exc.exit)
    except SchemaMissing:
        return _fail(
            Unavailable("the database has no claimd schema, or an older one: run `claimd migrate`"),
            4,
        )
    except (StoreUnavailable, OSError, TimeoutError) as exc:
        return _fail(Unavailable(f"lost the database: {exc}"), 4)
    except StoreRefused as exc:
        return _fail(exc, 1)
    finally:
        await backend.close()
    # JSON escapes control characters itself; a table or a run's output is the
    # job's text, and reaches the terminal escaped (render.terminal_safe).
    print(
        json.dumps(render.json_ready(payload), indent=2)
        if args.json
        else render.terminal_safe(text)
    )
    return code


def as_handler(command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_run(command, args))
        except KeyboardInterrupt:
            return 130
        except Exception as exc:  # one line, never a traceback
            if os.environ.get("CLAIMD_DEBUG"):
                raise
            return _fail(RuntimeError(f"unexpected {exc!r} (CLAIMD_DEBUG=1 shows where)"), 1)

    return run

"""`claimd reload`: SIGHUP a replica, then print its verdict, read from the database.

The replica records its verdict (actors.replica.reload): the jobs added, changed
and removed, or, refused, each error. Printed as a line (ok), one ``error:``
line per error on stderr (refused, exit 1), or with ``--json`` one JSON object
on stdout either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from actors.cli.operator import render
from actors.cli.operator.connect import connect_database, database_url, os_user
from actors.cli.operator.options import Commands, connection
from actors.cli.operator.running import EXIT_CODES, fail
from actors.clocks import Deadline
from actors.config import CodeImport, ConfigError, load_config
from actors.operator import OperatorError
from actors.ports import Action, Caller

CHANGE_KINDS = ("added", "changed", "removed")


def _names(details: dict[str, Any], kind: str) -> dict[str, Any]:
    found = details.get(kind)
    return found if isinstance(found, dict) else {"count": 0, "names": []}


def _errors(details: dict[str, Any]) -> tuple[int, list[str]]:
    found = details.get("errors")
    if not isinstance(found, dict):
        return 0, []
    return int(found.get("count", 0)), [str(m) for m in found.get("messages", [])]


def verdict_json(pid: int | None, ok: bool | None, result: str, details: dict[str, Any]) -> str:
    """The answer of `claimd reload --json`: one object, the same keys whatever happened."""
    count, messages = _errors(details)
    return json.dumps(
        {
            "ok": ok,
            "pid": pid,
            "result": result,
            **{kind: _names(details, kind) for kind in (*CHANGE_KINDS, "rejected")},
            "errors": {"count": count, "messages": messages},
            "settings_not_applied": details.get("settings_not_applied", []),
        },
        indent=2,
    )


def _refusal_lines(pid: int, result: str, details: dict[str, Any]) -> int:
    """A refused reload: each error of the file on its own ``error:`` line; exit 1."""
    count, messages = _errors(details)
    if not messages:
        return fail(f"process {pid}: {result}", 1)
    for message in messages:
        fail(f"process {pid}: {result}: {message}", 1)
    if count > len(messages):
        fail(f"process {pid}: and {count - len(messages)} more (claimd check-config lists all)", 1)
    return 1


async def _signal_and_wait(args: argparse.Namespace, pid: int) -> int:
    try:
        url = database_url(args)
        store = await connect_database(args, url) if url else None
    except OperatorError as exc:
        return fail(str(exc), exc.exit)
    try:
        before = await store.last_action_id() if store else 0
        try:
            # --force: SIGUSR1, the replica's forced reload (the rollback).
            os.kill(pid, signal.SIGUSR1 if args.force else signal.SIGHUP)
        except ProcessLookupError:
            return fail(f"no process {pid}", 3)
        except PermissionError:
            return fail(f"not allowed to signal process {pid}", 2)
        if store is None:
            name = "SIGUSR1 (forced reload)" if args.force else "SIGHUP"
            sent = f"sent {name} to {pid} (give --config to wait for the replica's verdict)"
            print(verdict_json(pid, None, sent, {}) if args.json else sent)
            return 0
        verdict = None
        deadline = Deadline.within(args.wait)
        while verdict is None and not deadline.passed():
            verdict = await store.reload_verdict(pid, before)
            if verdict is None:
                await asyncio.sleep(0.1)
        ok, result, details = verdict or (False, f"no verdict recorded within {args.wait:g}s", {})
        actor = Caller(args.actor or os_user(), "cli", f"{os.uname().nodename}:{os.getpid()}")
        arguments: dict[str, Any] = {"pid": pid, **({"force": True} if args.force else {})}
        await store.record_action(actor, Action("reload", ok, result, arguments=arguments))
    finally:
        if store is not None:
            await store.close()
    if args.json:
        print(verdict_json(pid, ok, result, details))
    if not ok:
        return 1 if args.json else _refusal_lines(pid, result, details)
    if not args.json:
        print(f"process {pid}: {result}")
        _settings_warning(pid, details)
    return 0


def _settings_warning(pid: int, details: dict[str, Any]) -> None:
    """A reload applies jobs only: changed ``[claimd]`` settings wait for a restart; say so."""
    names = [str(n) for n in details.get("settings_not_applied") or []]
    if names:
        print(
            f"warning: process {pid}: [claimd] settings changed but not applied until the "
            f"replica restarts: {', '.join(render.terminal_safe(n) for n in names)}",
            file=sys.stderr,
        )


def cmd_reload(args: argparse.Namespace) -> int:
    """SIGHUP: the replica rereads its config; then its verdict, read from the database."""
    if args.config:
        try:
            # The API tokens are the replica's (its environment), not this shell's.
            # Its python code is imported in a child process, not in this command.
            loaded = load_config(args.config, read_tokens=False, code=CodeImport(in_child=True))
        except ConfigError as exc:
            errors = [str(exc)]
        else:
            errors = [str(e) for e in loaded.errors]
        if errors:
            refused = "not signalled: the running replica would refuse this file"
            if args.json:
                details = {"errors": {"count": len(errors), "messages": errors}}
                print(verdict_json(None, False, refused, details))
            for error in errors:
                fail(f"{refused}: {error}", 2)
            return 2
    try:
        pid = args.pid if args.pid else int(Path(args.pid_file).read_text().strip())
    except (OSError, ValueError) as exc:
        return fail(f"cannot read a pid from {args.pid_file}: {exc}", 2)
    return asyncio.run(_signal_and_wait(args, pid))


def add_reload(commands: Commands) -> None:
    """`claimd reload --pid PID`: its own handler, not a backend command (it signals a process)."""
    rel = commands.sub.add_parser(
        "reload",
        allow_abbrev=False,
        help="make a running replica reread its config (SIGHUP) and report its verdict",
        description=(
            "Send SIGHUP to a replica (--pid, --pid-file), then wait for the verdict it "
            "records: the jobs added, changed and removed; or, refused (the running jobs "
            "stay as they were), each error of the file on its own 'error:' line on stderr, "
            "exit 1. --json prints one object on stdout either way: ok, pid, result, "
            "added/changed/removed/rejected ({count, names}), errors ({count, messages}), "
            "settings_not_applied ([claimd] settings changed in the file, applied at the next "
            "restart). With --config the file is checked here first and, refused, not "
            "signalled (exit 2). Without a database to read the verdict from, it only "
            "signals."
        ),
        epilog=f"exit status{EXIT_CODES}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    target = rel.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int)
    target.add_argument("--pid-file")
    rel.add_argument(
        "--force",
        action="store_true",
        help=(
            "roll back: apply the replica's file even when it is older than the config "
            "generation in force (SIGUSR1 instead of SIGHUP; recorded in the action log; "
            "docs/rollout.md)"
        ),
    )
    rel.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the replica's verdict (default 10)",
    )
    connection(rel)
    rel.set_defaults(func=cmd_reload, open_store=commands.open_store)

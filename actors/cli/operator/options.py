"""The arguments the operator's commands share, and the one way a command is added to `claimd`."""

from __future__ import annotations

import argparse
from typing import Any

from actors.cli.operator.connect import StoreOpener
from actors.cli.operator.running import EXIT_CODES, Command, as_handler

TIME_NOTE = (
    "Times are ISO 8601 ('2026-12-01 02:00', '2026-12-01T01:00Z') or 'now'; "
    "a time without an offset is read in the job's time zone."
)


def positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def overlap_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overlap",
        choices=["queue", "allow", "forbid"],
        help="the new runs' own overlap mode, for a job with overlap = forbid or queue "
        "(default queue: wait while another run of the job is active); a job with "
        "overlap = allow takes only allow",
    )


def database_options(g: Any) -> None:
    """Where the database URL comes from: a config file or the URL itself (the rest of
    connect.database_url's order is the environment, then a running `claimd dev`)."""
    g.add_argument("--config", help="read database_url from this config file")
    g.add_argument("--database-url", help="PostgreSQL URL (or CLAIMD_DATABASE_URL)")


def data_dir_option(g: Any) -> None:
    """Which running `claimd dev` to reach when nothing else names claimd."""
    g.add_argument(
        "--data-dir",
        "--dev-dir",
        dest="dev_dir",
        default=".claimd",
        metavar="DIR",
        help="the data folder of a running `claimd dev --data-dir DIR` (default ./.claimd)",
    )


def connection(p: argparse.ArgumentParser, *, output: bool = True) -> None:
    g = p.add_argument_group(
        "reaching claimd (default: a running `claimd dev` of this directory, or of --data-dir)"
    )
    database_options(g)
    g.add_argument("--url", help="a replica's HTTP API, e.g. http://127.0.0.1:8780 (or CLAIMD_URL)")
    # No --token VALUE: an argument is visible to every user of the host (ps).
    g.add_argument(
        "--token-file",
        help="read the bearer token for --url from this file (or CLAIMD_API_TOKEN); "
        "reads need one of scope read, actions one of scope operate, once the "
        "replica has tokens configured",
    )
    g.add_argument(
        "--actor",
        help="who is recorded as doing the action (default: your "
        "OS user; through --url the token's name is recorded, this beside it)",
    )
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="give up reaching claimd after this long (default 5)",
    )
    data_dir_option(g)
    if output:
        p.add_argument("--json", action="store_true", help="JSON for scripts")


class Commands:
    """The `claimd` subcommands an operator command is added to, each with the shared options.

    ``open_store`` opens the operator's store on a database URL: the adapter is
    named by the caller (the composition root), never here.
    """

    def __init__(self, sub: Any, open_store: StoreOpener) -> None:
        self.sub = sub
        self.open_store = open_store

    def add(self, name: str, help_text: str, fn: Command) -> argparse.ArgumentParser:
        """A subcommand ``name`` running ``fn`` on the backend the connection options reach."""
        p: argparse.ArgumentParser = self.sub.add_parser(
            name,
            # No abbreviations: `--token VALUE` must not pass as `--token-file VALUE`
            # (and the token be printed as a file that cannot be read).
            allow_abbrev=False,
            help=help_text,
            description=f"{help_text}. {TIME_NOTE}",
            epilog=f"exit status{EXIT_CODES}",
            formatter_class=argparse.RawTextHelpFormatter,
        )
        connection(p)
        p.set_defaults(func=as_handler(fn), open_store=self.open_store)
        return p

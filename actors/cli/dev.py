"""`claimd dev`: embedded PostgreSQL and NATS in a data folder, the example jobs, every actor.

The data folder is this process's alone while it lives (a lock); the servers'
set-up chatter goes to a log file beside them, and the operator's commands run
in this directory find the instance through the endpoints recorded there.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from actors.adapters.embedded import (
    DataDirBusy,
    EmbeddedUnavailable,
    lock_data_dir,
    require_embedded,
    start_nats,
    start_postgres,
)
from actors.adapters.resources import config_dir
from actors.cli import operator as operator_cli
from actors.cli.process import start_replica, write_pid_file
from actors.config import ConfigError, load_config
from actors.http.server import listen_problem
from actors.observability import redact
from actors.replica import Role


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        require_embedded()
    except EmbeddedUnavailable as exc:
        print(f"error: claimd dev: {exc}", file=sys.stderr)
        return 2
    config = Path(args.config) if args.config else config_dir() / "jobs.toml"
    # The file and the HTTP port are checked before any server starts: a bad
    # file or a busy port is one line and exit 2 within a second.
    http_env = {**os.environ, **({"CLAIMD_HTTP": args.http} if args.http else {})}
    try:
        http = load_config(config, env=http_env).settings
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = listen_problem(http.http_host, http.http_port)
    if problem is not None:
        print(
            f"claimd dev: {problem}; choose another with --http {http.http_host}:PORT "
            f"(--http {http.http_host}:0 picks a free one)",
            file=sys.stderr,
        )
        return 2
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # The data folder is this process's alone while it lives; a dead owner's
    # servers (a SIGKILLed claimd dev) are found and stopped or reused below.
    try:
        hold = lock_data_dir(data_dir)
    except DataDirBusy as exc:
        print(f"claimd dev: {exc}", file=sys.stderr)
        return 2
    try:
        return _dev_in(args, config, data_dir)
    finally:
        hold.release()


def _dev_in(args: argparse.Namespace, config: Path, data_dir: Path) -> int:
    write_pid_file(args.pid_file)
    # The embedded servers' set-up chatter (initdb, pg_ctl) goes to a file, not
    # the terminal; nats-server writes its own log beside its data.
    server_log = data_dir / "servers.log"
    with _logs_to_file(server_log, "pgserver", "py.warnings"):
        postgres = start_postgres(data_dir)
    _keep_logs_in_file(server_log, "pgserver")  # its messages at stop too
    nats = start_nats(data_dir, port=args.nats_port)
    try:
        env = {**os.environ, "CLAIMD_DATABASE_URL": postgres.url, "CLAIMD_NATS_URL": nats.url}
        if args.http:
            env["CLAIMD_HTTP"] = args.http
        try:
            loaded = load_config(config, env=env)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

        # Operator commands find this instance through ./.claimd; elsewhere, say how.
        operate = (
            []
            if data_dir == Path(".claimd").resolve()
            else [f"  operate      claimd jobs --data-dir {data_dir}  (any operator command)"]
        )

        # Whoever reaches the port reads everything unless a token is configured.
        reads = (
            "need a token (api_token_file / api_token_env)"
            if loaded.settings.api_tokens
            else "open to whoever reaches the port (no token configured; "
            "docs/http-api.md, The HTTP face)"
        )

        def banner(host: str | None, port: int | None) -> None:
            base = f"http://{host}:{port}" if host is not None else None
            print(
                "\n".join(
                    [
                        "claimd dev is starting",
                        f"  status page  {base}/" if base else "  http         off",
                        *([f"  metrics      {base}/metrics"] if base else []),
                        *([f"  reads        {reads}"] if base else []),
                        f"  postgres     {redact(postgres.url)}",
                        f"  nats         {nats.url}",
                        f"  config       {config}",
                        f"  data         {data_dir}  (server logs: {server_log}, "
                        f"{data_dir / 'nats' / 'nats-server.log'})",
                        *operate,
                        f"  stop         Ctrl-C, or kill -TERM {os.getpid()}",
                        "",
                    ]
                ),
                file=sys.stderr,
                flush=True,
            )

        if loaded.settings.http_port < 0:
            banner(None, None)
        # Operator commands run in this directory find this instance through it.
        settings = loaded.settings
        endpoints = operator_cli.record_dev_endpoints(
            data_dir,
            postgres.url,
            nats.url,
            f"http://{settings.http_host}:{settings.http_port}" if settings.http_port > 0 else None,
        )

        def serving(host: str, port: int) -> None:
            # The port actually bound (http_port 0 picks a free one), once it is known.
            operator_cli.record_dev_endpoints(
                data_dir, postgres.url, nats.url, f"http://{host}:{port}"
            )
            banner(host, port)

        try:
            # Each reload rereads the file with this environment (the embedded URLs).
            return start_replica(config, loaded, Role.ALL, on_http=serving, env=env)
        finally:
            operator_cli.forget_dev_endpoints(endpoints)
    finally:
        nats.stop()
        postgres.stop()


@contextlib.contextmanager
def _logs_to_file(path: Path, *loggers: str) -> Iterator[None]:
    """While the block runs, these stdlib loggers write to ``path`` instead of stderr."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = []
    for name in loggers:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in saved:
            logger.removeHandler(handler)
            logger.propagate = propagate
        handler.close()


def _keep_logs_in_file(path: Path, name: str) -> None:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.propagate = False

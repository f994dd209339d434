"""The `claimd` command: dev, run, migrate, check-config; the operator's commands
(jobs, runs, show, audit, actions, pause, resume, trigger, cancel, backfill, reload)
live in actors.cli.operator."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from actors.adapters.embedded import (
    DataDirBusy,
    EmbeddedUnavailable,
    lock_data_dir,
    require_embedded,
    start_nats,
    start_postgres,
)
from actors.adapters.nats import StreamSettingsRefused
from actors.adapters.postgres import PostgresRunStore
from actors.adapters.resources import config_dir
from actors.cli import notifications as notifications_cli
from actors.cli import operator as operator_cli
from actors.cli.fire_times import job_fire_times, text_lines
from actors.config import CodeImport, ConfigError, LoadedConfig, load_config
from actors.domain import CronSchedule, decode_job, encode_job
from actors.http.server import PortUnavailable, listen_problem
from actors.observability import LOG_FORMATS, configure_logging, get_logger, redact
from actors.observability.tracing import configure as configure_tracing
from actors.operator import OperatorError
from actors.operator_root import open_operator_store
from actors.replica import Replica, Role
from actors.scheduling.supervisor import ActorGaveUp

log = get_logger("cli")


def _load(path: str) -> LoadedConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_replica(
    path: Path,
    loaded: LoadedConfig,
    role: Role,
    on_http: Callable[[str, int], None] | None = None,
    env: dict[str, str] | None = None,
) -> int:
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


def _write_pid_file(path: str | None) -> None:
    if path:
        Path(path).write_text(f"{os.getpid()}\n")


def cmd_run(args: argparse.Namespace) -> int:
    loaded = _load(args.config)
    _write_pid_file(args.pid_file)
    return _run_replica(Path(args.config), loaded, Role(args.role))


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
    _write_pid_file(args.pid_file)
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
            return _run_replica(config, loaded, Role.ALL, on_http=serving, env=env)
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


def cmd_migrate(args: argparse.Namespace) -> int:
    try:
        # The operator's commands' resolver: flag, environment, config, a running dev.
        url = operator_cli.database_url(args)
    except OperatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit
    if url is None:
        print("error: give --database-url, CLAIMD_DATABASE_URL or --config", file=sys.stderr)
        return 2

    async def go() -> list[str]:
        store = await PostgresRunStore.connect(url, max_size=1)
        try:
            return await store.migrate()
        finally:
            await store.close()

    try:
        applied = asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - unreachable, refused, bad URL: one line
        print(
            f"error: cannot migrate the database at {redact(url)}: "
            f"{' '.join(str(exc).split()) or type(exc).__name__}",
            file=sys.stderr,
        )
        return 4
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate a config and print what the scheduler will really fire for each job.

    Each job goes through the same round trip as in a running replica (its
    stored definition, read back by decode_job, as the materializer
    does), so the instants printed come from the code that writes the rows.
    """
    try:
        # The python code it names is imported in a child process with a deadline:
        # a module's side effects or a hang stay there.
        loaded = load_config(args.file, code=CodeImport(in_child=True, timeout=args.import_timeout))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = datetime.fromisoformat(args.from_time) if args.from_time else datetime.now(UTC)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    # On stderr with the summary: stdout stays the jobs and their fire times.
    for line in loaded.settings.timeouts.describe():
        print(line, file=sys.stderr)
    records: list[dict[str, object]] = []
    for name, configured in sorted(loaded.jobs.items()):
        schedule = decode_job(name, encode_job(configured)).schedule
        header = f"{name}: {schedule.describe()}"
        if isinstance(schedule, CronSchedule):
            header += f": {schedule.cron.explain()}"
        record: dict[str, object] = {"job": name, "schedule": schedule.describe()}
        record.update(job_fire_times(schedule, start, args.count))
        records.append(record)
        if not args.json:
            print(header)
            for line in text_lines(record):
                print(line)
    if args.json:
        print(
            json.dumps(
                {"jobs": records, "errors": [str(e) for e in loaded.errors]}, ensure_ascii=False
            )
        )
    for error in loaded.errors:
        print(f"error: {error}", file=sys.stderr)
    if loaded.errors:
        return 2
    print(f"ok: {len(loaded.jobs)} jobs", file=sys.stderr)
    return 0


DESCRIPTION = """claimd: a distributed cron scheduler (PostgreSQL claims, NATS JetStream dispatch).

Process commands: dev (embedded servers, for trying claimd), run (a replica),
migrate, check-config. Operator commands: jobs, runs, show, audit, actions,
pause, resume, trigger, cancel, backfill, reload. `claimd COMMAND --help` for one."""


def build_parser() -> argparse.ArgumentParser:
    parser = operator_cli.OneLineParser(
        prog="claimd",
        description=DESCRIPTION,
        formatter_class=argparse.RawTextHelpFormatter,
        epilog=f"exit status of the operator's commands{operator_cli.EXIT_CODES}",
    )
    _logging_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="embedded PostgreSQL + NATS, example jobs, every actor")
    dev.add_argument("--config", help="config file (default: the shipped config/jobs.toml)")
    dev.add_argument("--data-dir", default=".claimd", help="where the servers keep data")
    dev.add_argument("--nats-port", type=int, default=None)
    dev.add_argument(
        "--http",
        help='host:port for /metrics and the API, or "off" '
        "(default: the config's; CLAIMD_HTTP overrides too)",
    )
    dev.add_argument("--pid-file", help="write the pid here (for `claimd reload`)")
    dev.set_defaults(func=cmd_dev)

    run = sub.add_parser("run", help="connect to the servers in the config / environment")
    run.add_argument("--config", required=True)
    run.add_argument("--role", choices=[r.value for r in Role], default="all")
    run.add_argument("--pid-file", help="write the pid here (for `claimd reload`)")
    run.set_defaults(func=cmd_run)

    operator_cli.register(sub, open_operator_store)
    notifications_cli.register(sub)

    mig = sub.add_parser("migrate", help="apply the schema migrations")
    mig.add_argument("--database-url")
    mig.add_argument("--config")
    mig.set_defaults(func=cmd_migrate)

    chk = sub.add_parser("check-config", help="validate a config; print next fire times")
    chk.add_argument("file")
    chk.add_argument("--from", dest="from_time", help="ISO 8601 start (default now)")
    chk.add_argument("--count", type=int, default=5)
    chk.add_argument(
        "--import-timeout",
        type=float,
        default=30.0,
        help="seconds the import of the python code it names may take (default 30)",
    )
    chk.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout: each job's fire times (utc, local, offset, dst)",
    )
    chk.set_defaults(func=cmd_check_config)
    # The logging options are accepted after the subcommand too (`claimd run
    # --log-format console`); there they only override what was given before it.
    for command in sub.choices.values():
        _logging_options(command, defaults=False)
    return parser


def _logging_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    def default(value: str) -> str:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--log-level",
        default=default(os.environ.get("CLAIMD_LOG_LEVEL", "INFO")),
        help="DEBUG, INFO, WARNING or ERROR (default INFO; CLAIMD_LOG_LEVEL)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default(os.environ.get("CLAIMD_LOG_FORMAT", "auto")),
        help="json: one JSON object per line; console: for people; auto "
        "(default; CLAIMD_LOG_FORMAT): console when stderr is a "
        "terminal, else json",
    )
    parser.add_argument(
        "--console-logs",
        dest="log_format",
        action="store_const",
        const="console",
        default=argparse.SUPPRESS,
        help="the same as --log-format console",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        print(
            f"error: --log-level {args.log_level!r} is not DEBUG, INFO, WARNING or ERROR",
            file=sys.stderr,
        )
        return 2
    configure_logging(args.log_level.upper(), args.log_format)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

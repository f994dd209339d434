"""The `claimd` command: dev, run, migrate, check-config; the operator's commands
(jobs, runs, show, audit, actions, pause, resume, trigger, cancel, backfill, reload)
live in actors.cli.operator."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from actors.adapters.postgres import PostgresRunStore
from actors.cli import notifications as notifications_cli
from actors.cli import operator as operator_cli
from actors.cli.dev import cmd_dev
from actors.cli.fire_times import job_fire_times, text_lines
from actors.cli.operator_store import open_operator_store
from actors.cli.process import load_or_exit, start_replica, write_pid_file
from actors.clocks import utc_now
from actors.config import CodeImport, ConfigError, load_config
from actors.domain import CronSchedule, decode_job, encode_job
from actors.observability import LOG_FORMATS, configure_logging, redact
from actors.operator import OperatorError
from actors.replica import Role


def cmd_run(args: argparse.Namespace) -> int:
    loaded = load_or_exit(args.config)
    write_pid_file(args.pid_file)
    return start_replica(Path(args.config), loaded, Role(args.role))


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
    start = datetime.fromisoformat(args.from_time) if args.from_time else utc_now()
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

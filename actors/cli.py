"""The `claimd` command: dev, run, migrate, check-config, reload and operator actions."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from datetime import UTC, datetime, tzinfo
from pathlib import Path

import asyncpg

from actors.adapters.embedded import (
    EmbeddedUnavailable,
    require_embedded,
    start_nats,
    start_postgres,
)
from actors.adapters.postgres import (
    BACKFILL_CHUNK,
    BACKFILL_MAX_RUNS,
    BackfillProgress,
    BackfillTooLarge,
    Operations,
    PostgresRunStore,
    UnknownJob,
)
from actors.adapters.resources import config_dir
from actors.app import Replica, Role
from actors.config import ConfigError, LoadedConfig, load_config
from actors.domain import CronSchedule, job_from_definition, take
from actors.observability import configure_logging, get_logger, redact
from actors.supervisor import ActorGaveUp

log = get_logger("cli")


def _load(path: str) -> LoadedConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_replica(path: Path, loaded: LoadedConfig, role: Role) -> int:
    replica = Replica(path, loaded, role)
    try:
        asyncio.run(replica.run())
    except (ExceptionGroup, ActorGaveUp, OSError) as exc:
        failures = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        for failure in failures:
            what = ("an actor gave up" if isinstance(failure, ActorGaveUp)
                    else "a server is unreachable or failed")
            log.error(f"stopping: {what}", error=redact(repr(failure)))
        return 1
    return 1 if replica.forced_stop else 0


def _write_pid_file(path: str | None) -> None:
    if path:
        Path(path).write_text(f"{os.getpid()}\n")


def cmd_run(args: argparse.Namespace) -> int:
    loaded = _load(args.config)
    _write_pid_file(args.pid_file)
    return _run_replica(Path(args.config), loaded, Role(args.role))


def cmd_reload(args: argparse.Namespace) -> int:
    """Send SIGHUP: the replica rereads its config; a file with errors changes nothing."""
    if args.config:
        loaded = _load(args.config)
        if loaded.errors:
            for error in loaded.errors:
                print(f"error: {error}", file=sys.stderr)
            print("not reloaded: the running replica would refuse this file", file=sys.stderr)
            return 2
    pid = args.pid if args.pid else int(Path(args.pid_file).read_text().strip())
    os.kill(pid, signal.SIGHUP)
    print(f"sent SIGHUP to {pid}")
    return 0


def _database_url(args: argparse.Namespace) -> str:
    url = getattr(args, "database_url", None) or os.environ.get("CLAIMD_DATABASE_URL")
    if url is None and getattr(args, "config", None):
        url = _load(args.config).settings.database_url
    if url is None:
        print("error: give --database-url, CLAIMD_DATABASE_URL or --config", file=sys.stderr)
        raise SystemExit(2)
    return url


class UsageError(ValueError):
    """A command's arguments cannot be acted on; the message names the argument."""


def _parse_time(text: str, argument: str = "time") -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{argument} {text!r} is not an ISO 8601 time "
                         "(e.g. 2026-03-01T00:00:00+00:00; no offset means UTC)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _print_backfill_progress(done: BackfillProgress) -> None:
    """One stderr line per chunk of a backfill longer than one chunk."""
    if done.instants <= BACKFILL_CHUNK or done.through is None:
        return
    print(f"backfill {done.job}: {done.covered:,}/{done.instants:,} instants "
          f"(through {done.through.isoformat()}), {done.added:,} added", file=sys.stderr)


async def _backfill(ops: Operations, args: argparse.Namespace) -> str:
    start = _parse_time(args.start, "--from")
    end = _parse_time(args.end, "--to")
    if start > end:
        raise UsageError(f"--from {start.isoformat()} is after --to {end.isoformat()}")
    try:
        done = await ops.backfill(args.job, start, end, max_runs=args.max_runs,
                                  progress=_print_backfill_progress)
    except BackfillTooLarge as exc:
        raise UsageError(f"{exc} (from {start.isoformat()} to {end.isoformat()}); "
                         "nothing added: split the range or raise --max-runs") from None
    return (f"backfilled {args.job}: {done.instants:,} instants from {start.isoformat()} "
            f"to {end.isoformat()}: {done.added:,} runs added, "
            f"{done.existing:,} already had a run")


async def _operate(args: argparse.Namespace) -> str:
    pool = await asyncpg.create_pool(_database_url(args), min_size=1, max_size=2)
    assert pool is not None
    ops = Operations(pool)
    try:
        if args.command == "pause":
            await ops.pause(args.job)
            return f"paused {args.job}"
        if args.command == "resume":
            await ops.resume(args.job)
            return f"resumed {args.job}"
        if args.command == "trigger":
            # Without --at the instant is the database's now(), not this host's clock.
            at = (_parse_time(args.at, "--at") if args.at
                  else await PostgresRunStore(pool).database_now())
            run_id = await ops.trigger(args.job, at)
            return (f"triggered {args.job}: run {run_id} at {at.isoformat()}" if run_id
                    else f"{args.job} already has a run at {at.isoformat()}; nothing added")
        if args.command == "cancel":
            ok = await ops.cancel(args.run_id)
            return f"cancelled {args.run_id}" if ok else f"{args.run_id} is not pending/running"
        if args.command == "backfill":
            return await _backfill(ops, args)
        raise AssertionError(args.command)
    finally:
        await pool.close()


def cmd_operate(args: argparse.Namespace) -> int:
    try:
        print(asyncio.run(_operate(args)))
    except (UnknownJob, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        require_embedded()
    except EmbeddedUnavailable as exc:
        print(f"error: claimd dev: {exc}", file=sys.stderr)
        return 2
    config = Path(args.config) if args.config else config_dir() / "jobs.toml"
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"claimd dev: data in {data_dir}, config {config}", file=sys.stderr)
    _write_pid_file(args.pid_file)
    postgres = start_postgres(data_dir)
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
        print(f"claimd dev: postgres {postgres.url}  nats {nats.url}  "
              f"http http://{loaded.settings.http_host}:{loaded.settings.http_port}/metrics",
              file=sys.stderr)
        return _run_replica(config, loaded, Role.ALL)
    finally:
        nats.stop()
        postgres.stop()


def cmd_migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("CLAIMD_DATABASE_URL")
    if url is None and args.config:
        url = _load(args.config).settings.database_url
    if url is None:
        print("error: give --database-url, CLAIMD_DATABASE_URL or --config", file=sys.stderr)
        return 2

    async def go() -> list[str]:
        store = await PostgresRunStore.connect(url, max_size=1)
        try:
            return await store.migrate()
        finally:
            await store.close()

    applied = asyncio.run(go())
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate a config and print what the scheduler will really fire for each job.

    Each job goes through the same round trip as in a running replica (its
    stored definition, read back by job_from_definition, as the materializer
    does), so the instants printed come from the code that writes the rows.
    """
    try:
        loaded = load_config(args.file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = datetime.fromisoformat(args.from_time) if args.from_time else datetime.now(UTC)
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    for name, configured in sorted(loaded.jobs.items()):
        schedule = job_from_definition(name, configured.definition()).schedule
        zone: tzinfo
        if isinstance(schedule, CronSchedule):
            zone = schedule.zone
            print(f"{name}: {schedule.describe()}: {schedule.cron.explain()}")
        else:
            zone = UTC
            print(f"{name}: {schedule.describe()}")
        far = start.replace(year=start.year + 10)
        for instant in take(schedule.fire_times(start, far), args.count):
            print(f"  {instant.isoformat()}  {instant.astimezone(zone).isoformat()}")
    for error in loaded.errors:
        print(f"error: {error}", file=sys.stderr)
    if loaded.errors:
        return 2
    print(f"ok: {len(loaded.jobs)} jobs", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="claimd", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("CLAIMD_LOG_LEVEL", "INFO"))
    parser.add_argument("--console-logs", action="store_true",
                        help="human-readable logs instead of JSON lines")
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="embedded PostgreSQL + NATS, example jobs, every actor")
    dev.add_argument("--config", help="config file (default: the shipped config/jobs.toml)")
    dev.add_argument("--data-dir", default=".claimd", help="where the servers keep data")
    dev.add_argument("--nats-port", type=int, default=None)
    dev.add_argument("--http", help='host:port for /metrics and the API, or "off" '
                     "(default: the config's; CLAIMD_HTTP overrides too)")
    dev.add_argument("--pid-file", help="write the pid here (for `claimd reload`)")
    dev.set_defaults(func=cmd_dev)

    run = sub.add_parser("run", help="connect to the servers in the config / environment")
    run.add_argument("--config", required=True)
    run.add_argument("--role", choices=[r.value for r in Role], default="all")
    run.add_argument("--pid-file", help="write the pid here (for `claimd reload`)")
    run.set_defaults(func=cmd_run)

    rel = sub.add_parser("reload", help="make a running replica reread its config (SIGHUP)")
    target = rel.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int)
    target.add_argument("--pid-file")
    rel.add_argument("--config", help="check this file first; refuse to signal if it is bad")
    rel.set_defaults(func=cmd_reload)

    def operator(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", help="read database_url from this config file")
        p.add_argument("--database-url")
        p.set_defaults(func=cmd_operate)
        return p

    operator("pause", "stop materializing and claiming a job's runs").add_argument("job")
    operator("resume", "undo pause").add_argument("job")
    trig = operator("trigger", "run a job now (one run per instant still)")
    trig.add_argument("job")
    trig.add_argument("--at", help="the instant (ISO 8601; default now)")
    operator("cancel", "cancel a pending or running run").add_argument("run_id")
    back = operator("backfill", "one run per missed instant in a range (idempotent)")
    back.description = (
        "Add one run for each instant of JOB's schedule from --from to --to (both "
        "included) that has no run yet; instants that have one are left alone, so "
        f"running it again adds nothing. Written {BACKFILL_CHUNK:,} instants per "
        "statement, with progress on stderr; an interrupted backfill is finished by "
        "running it again. Exit status: 0 done; 2 refused, nothing added (unknown "
        "job, a time that is not ISO 8601, --from after --to, or more instants than "
        "--max-runs).")
    back.add_argument("job")
    back.add_argument("--from", dest="start", required=True,
                      help="first instant (ISO 8601; no offset means UTC)")
    back.add_argument("--to", dest="end", required=True, help="last instant (ISO 8601)")
    back.add_argument("--max-runs", type=_positive_int, default=BACKFILL_MAX_RUNS,
                      help=f"refuse a range of more instants than this "
                           f"(default {BACKFILL_MAX_RUNS:,})")

    mig = sub.add_parser("migrate", help="apply the schema migrations")
    mig.add_argument("--database-url")
    mig.add_argument("--config")
    mig.set_defaults(func=cmd_migrate)

    chk = sub.add_parser("check-config", help="validate a config; print next fire times")
    chk.add_argument("file")
    chk.add_argument("--from", dest="from_time", help="ISO 8601 start (default now)")
    chk.add_argument("--count", type=int, default=5)
    chk.set_defaults(func=cmd_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level.upper(), json_logs=not args.console_logs)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

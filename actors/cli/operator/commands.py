"""The operator's commands: jobs, runs, show, audit, actions, and the actions themselves.

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
import fnmatch
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from actors.cli.operator import logs, render
from actors.cli.operator.connect import Backend, StoreOpener, open_backend
from actors.cli.operator.reload import cmd_reload
from actors.domain.backfill import BACKFILL_CHUNK, BACKFILL_MAX_RUNS
from actors.domain.pause import DEFAULT_PAUSED_INSTANTS, PausedInstants
from actors.domain.trigger import EARLIEST_TRIGGER
from actors.operator import BadInput, NotFound, OperatorError, Unavailable
from actors.ports import SchemaMissing, StoreRefused, StoreUnavailable

EXIT_CODES = __doc__.split("Exit status", 1)[1] if __doc__ else ""
TIME_NOTE = (
    "Times are ISO 8601 ('2026-12-01 02:00', '2026-12-01T01:00Z') or 'now'; "
    "a time without an offset is read in the job's time zone."
)
Result = tuple[Any, str, int]
Command = Callable[[Backend, argparse.Namespace], Awaitable[Result]]


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line (and exit status 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _fail(exc: BaseException, code: int) -> int:
    message = render.terminal_safe(" ".join(str(exc).split()) or type(exc).__name__)
    print(f"error: {message}", file=sys.stderr)
    return code


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
    print(json.dumps(payload, indent=2) if args.json else render.terminal_safe(text))
    return code


def _command(command: Command) -> Callable[[argparse.Namespace], int]:
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


# --- reads ----------------------------------------------------------------------------


async def jobs(backend: Backend, args: argparse.Namespace) -> Result:
    rows = await backend.get("jobs")
    rows = rows if args.all else [j for j in rows if j["enabled"]]
    if args.pattern:
        rows = [j for j in rows if _name_matches(j["name"], args.pattern)]
    # `--json` prints the API's job list as it is; the table adds the jobs the
    # config file rejected (GET /api/config/rejected), new ones included.
    rejected = [] if args.json else await backend.get("rejected_jobs")
    if args.pattern:
        rejected = [r for r in rejected if _name_matches(r["job"], args.pattern)]
    # And the config generation in force, and whether the replicas disagree (docs/rollout.md).
    config = None if args.json else await backend.get("config_rollout")
    return rows, render.jobs(rows, rejected, config, wide=args.wide), 0


def _name_matches(name: str, pattern: str) -> bool:
    """A glob (``billing-*``) when it has one of ``*?[``, else a part of the name."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


async def runs(backend: Backend, args: argparse.Namespace) -> Result:
    states = [s for value in args.state or [] for s in value.split(",") if s]
    page = await backend.get(
        "runs",
        job=args.job,
        states=states or None,
        since=args.since,
        until=args.until,
        limit=args.limit,
        cursor=args.cursor,
        ahead=args.ahead,
    )
    return page, render.runs(page), 0


def _is_run_id(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


async def show(backend: Backend, args: argparse.Namespace) -> Result:
    """One run by its id, or a job's latest run (what `claimd show JOB` asks: why did it fail)."""
    run_id = args.run_id
    if not _is_run_id(run_id):
        page = await backend.get("runs", job=run_id, limit=1)
        if not page["runs"]:
            raise NotFound(
                f"job {run_id!r} has no run yet (claimd runs {run_id} --ahead lists "
                "the ones written ahead)"
            )
        run_id = page["runs"][0]["id"]
    found = await backend.get("run", run_id=run_id)
    return found, render.run(found), 0


async def audit(backend: Backend, args: argparse.Namespace) -> Result:
    if args.at and (args.start or args.end):
        raise BadInput("give --at, or --from and --to, not both")
    if not args.at and not (args.start and args.end):
        raise BadInput("give --from and --to (a range), or --at (one instant)")
    start, end = (args.at, args.at) if args.at else (args.start, args.end)
    result = await backend.get("audit", job=args.job, start=start, end=end)
    return (result, render.audit(result, args.problems), 0 if result["summary"]["complete"] else 1)


async def actions(backend: Backend, args: argparse.Namespace) -> Result:
    rows = await backend.get("actions", job=args.job, limit=args.limit)
    return rows, render.actions(rows), 0


# --- actions --------------------------------------------------------------------------


def _action(name: str, *fields: str) -> Command:
    async def act(backend: Backend, args: argparse.Namespace) -> Result:
        result = await backend.act(name, **{f: getattr(args, f) for f in fields})
        # A backfill whose every instant already had a run changed nothing: 3,
        # as a trigger of an instant that already has a run is.
        nothing = name == "backfill" and result.get("added") == 0
        return result, result["message"], 3 if nothing else 0

    return act


WAIT_POLL_S = 0.5  # how often `trigger --wait` reads the run


async def _trigger(backend: Backend, args: argparse.Namespace) -> Result:
    """Trigger; with ``--wait``, follow the run to its end and answer with it."""
    answer, message, code = await _action("trigger", "job", "at", "overlap")(backend, args)
    if not args.wait or code != 0:
        return answer, message, code
    if not getattr(args, "json", False):
        print(message, file=sys.stderr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.wait_timeout
    while True:
        run = await backend.get("run", run_id=answer["run_id"])
        if run["state"] not in render.UNFINISHED:
            return run, render.run(run), 0 if run["state"] == "succeeded" else 1
        if loop.time() >= deadline:
            raise WaitTimedOut(
                f"run {answer['run_id']} still {run['state']} after {args.wait_timeout}s "
                "(it goes on; claimd show follows it)"
            )
        await asyncio.sleep(WAIT_POLL_S)


class WaitTimedOut(OperatorError):
    """``trigger --wait`` gave up: the run has not finished (it goes on)."""

    status = 504
    exit = 5


async def _resume(backend: Backend, args: argparse.Namespace) -> Result:
    """Resume, saying first what becomes of the paused instants (the answer says how many).

    The notice is for a person at a terminal; a script reads the answer (and an
    error stays one line)."""
    if not getattr(args, "json", False) and sys.stderr.isatty():
        if args.paused_instants == PausedInstants.SKIP.value:
            plan = "none runs, each is recorded as paused (--paused-instants run to run them)"
        else:
            plan = "they run as its catch-up policy says"
        print(
            f"resuming {render.terminal_safe(args.job)}: of the instants that came due "
            f"while it was paused, {plan}",
            file=sys.stderr,
        )
    return await _action("resume", "job", "paused_instants")(backend, args)


# --- arguments ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _overlap_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overlap",
        choices=["queue", "allow", "forbid"],
        help="the new runs' own overlap mode, for a job with overlap = forbid or queue "
        "(default queue: wait while another run of the job is active); a job with "
        "overlap = allow takes only allow",
    )


def _connection(p: argparse.ArgumentParser, *, output: bool = True) -> None:
    g = p.add_argument_group(
        "reaching claimd (default: a running `claimd dev` of this directory, or of --data-dir)"
    )
    g.add_argument("--config", help="read database_url from this config file")
    g.add_argument("--database-url", help="PostgreSQL URL (or CLAIMD_DATABASE_URL)")
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
    g.add_argument(
        "--data-dir",
        "--dev-dir",
        dest="dev_dir",
        default=".claimd",
        metavar="DIR",
        help="the data folder of a running `claimd dev --data-dir DIR` (default ./.claimd)",
    )
    if output:
        p.add_argument("--json", action="store_true", help="JSON for scripts")


def register(sub: Any, open_store: StoreOpener) -> None:
    """Add the operator's commands to the `claimd` parser.

    ``open_store`` opens the operator's store on a database URL: the adapter is
    named by the caller (actors.operator_root), never here.
    """

    def command(name: str, help_text: str, fn: Command) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            # No abbreviations: `--token VALUE` must not pass as `--token-file VALUE`
            # (and the token be printed as a file that cannot be read).
            allow_abbrev=False,
            help=help_text,
            description=f"{help_text}. {TIME_NOTE}",
            epilog=f"exit status{EXIT_CODES}",
            formatter_class=argparse.RawTextHelpFormatter,
        )
        _connection(p)
        p.set_defaults(func=_command(fn), open_store=open_store)
        return p

    p = command(
        "jobs",
        "every job: schedule, zone, next fire, last outcome, last success, overdue backlog, paused",
        jobs,
    )
    p.add_argument(
        "pattern",
        nargs="?",
        help="only the jobs whose name matches: a glob (billing-*) or a part of the name",
    )
    p.add_argument("--all", action="store_true", help="include jobs removed from the config")
    p.add_argument(
        "--wide",
        action="store_true",
        help="every column (UTC times, last success, runs written ahead) and whole errors",
    )
    p = command("runs", "runs that have happened (scheduled at or before now), newest first", runs)
    p.add_argument("job", nargs="?", help="only this job's runs")
    p.add_argument(
        "--state",
        action="append",
        help="only these states (repeat, or "
        "comma-separated): pending claimed running succeeded failed skipped "
        "cancelled",
    )
    p.add_argument("--since", help="scheduled at or after (the job's zone; UTC without JOB)")
    p.add_argument("--until", help="scheduled at or before (the job's zone; UTC without JOB)")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--cursor", help="continue a listing where the previous page ended")
    p.add_argument(
        "--ahead",
        action="store_true",
        help="include the runs written ahead of time, not yet due (default: what has happened, "
        "scheduled at or before now)",
    )
    p = command(
        "show",
        "one run (by RUN_ID, or JOB's latest): attempts and verdicts, errors, output tail, "
        "lease, epoch",
        show,
    )
    p.add_argument(
        "run_id", metavar="RUN_ID|JOB", help="a run's id, or a job's name: its latest run"
    )
    p = command(
        "audit",
        "did every due instant of JOB in a range run? each instant with "
        "its run, or why it has none",
        audit,
    )
    p.add_argument("job")
    p.add_argument("--from", dest="start", help="first instant (job's zone)")
    p.add_argument("--to", dest="end", help="last instant, inclusive")
    p.add_argument("--at", help="one instant (job's zone): the same as --from AT --to AT")
    p.add_argument(
        "--problems",
        action="store_true",
        help="list only missing, failed and stuck instants (the summary counts all)",
    )
    p = command("actions", "operator actions: who, when, what, arguments, result", actions)
    p.add_argument("--job")
    p.add_argument("--limit", type=int, default=50)

    command(
        "pause",
        "stop materializing and claiming a job's runs (claimed, unstarted ones go back to pending)",
        _action("pause", "job"),
    ).add_argument("job")
    p = command("resume", "undo pause", _resume)
    p.description = (
        "Undo pause. --paused-instants says what becomes of the instants that came due "
        "while JOB was paused: 'skip' (the default) runs none of them: the runs written "
        "ahead for them become skipped and the instants not written yet are recorded as "
        'a gap, both with the reason "paused ..." (claimd audit lists them as paused, '
        "not missing), and the schedule goes on from now. 'run' leaves them to the "
        'job\'s catch-up policy, as after a downtime: with catchup = "all" (the default) '
        "every one of them within catchup_window runs, all at once, on resume; "
        '"latest" runs the newest; "none" only those still within its starting '
        "deadline. Runs added by trigger or backfill run either way."
    )
    p.add_argument("job")
    p.add_argument(
        "--paused-instants",
        choices=["run", "skip"],
        default=DEFAULT_PAUSED_INSTANTS.value,
        help="skip (default): none of them runs, each recorded as paused; "
        "run: as the job's catch-up policy says",
    )
    p = command(
        "trigger",
        "a run now, for now or a past instant (one run per instant still)",
        _trigger,
    )
    p.description = (
        "Add a run of JOB for one instant, due now: --at (default: now on the database's "
        "clock). Only an instant at or before now is accepted: a future one would run "
        "today and use up that instant, so its scheduled run would never happen (refused, "
        f"exit 2, as is an instant before {EARLIEST_TRIGGER.date().isoformat()}). The "
        "answer says whether the schedule names the instant: if it does, this run is that "
        "instant's run and the schedule adds no other; if not, it is an extra run. An "
        "instant that already has a run is left alone (exit 3). For a job with overlap = "
        "forbid or queue the run waits its turn while another run of the job is active "
        "(--overlap queue, the default; the answer names that run); --overlap forbid is "
        "refused then (exit 2: the run would be skipped), --overlap allow runs it beside. "
        + TIME_NOTE
    )
    p.add_argument("job")
    p.add_argument(
        "--at",
        help="the instant, at or before now; in the job's zone without an offset (default: now)",
    )
    _overlap_option(p)
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the run to finish, then show it (exit 0 succeeded, 1 otherwise)",
    )
    p.add_argument(
        "--wait-timeout",
        type=_positive_int,
        default=3600,
        metavar="SECONDS",
        help="give up waiting after this long (exit 5; the run goes on); default 3600",
    )
    command("cancel", "cancel a pending or running run", _action("cancel", "run_id")).add_argument(
        "run_id"
    )
    p = command(
        "backfill",
        "one run per missed instant in a range (idempotent)",
        _action("backfill", "job", "start", "end", "max_runs", "overlap"),
    )
    p.description = (
        "Add one run for each instant of JOB's schedule from --from to --to (both "
        "included) that has no run yet; instants that have one are left alone, so running "
        f"it again adds nothing (and still exits 0). Written {BACKFILL_CHUNK:,} instants per "
        "statement, with progress on stderr; an interrupted backfill is finished by "
        "running it again. Refused before anything is written (exit 2) past --max-runs, "
        "and for a range that ends after now (a backfilled run runs now: an instant still "
        "ahead would be used up and its scheduled run never happen; end it with --to now) "
        f"or begins before {EARLIEST_TRIGGER.date().isoformat()}, as a trigger is. Every "
        "instant added runs: for a job with overlap = forbid or queue, one after another "
        "(--overlap queue, the default: each waits while a run of the job is active), at "
        "once (--overlap allow), or as the job's own runs (--overlap forbid, a forbid job's "
        "only: skipped if a run is active when due). " + TIME_NOTE
    )
    p.add_argument("job")
    p.add_argument("--from", dest="start", required=True, help="first instant (job's zone)")
    p.add_argument("--to", dest="end", required=True, help="last instant, inclusive")
    p.add_argument(
        "--max-runs",
        type=_positive_int,
        default=BACKFILL_MAX_RUNS,
        help=f"refuse a range of more instants than this (default {BACKFILL_MAX_RUNS:,})",
    )
    _overlap_option(p)

    rel = sub.add_parser(
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
    _connection(rel)
    rel.set_defaults(func=cmd_reload, open_store=open_store)
    logs.register(sub, open_store)  # `claimd logs [-f]`: actors/cli/operator/logs.py

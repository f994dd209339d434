"""The operator's read commands: jobs, runs, show, audit, actions."""

from __future__ import annotations

import argparse
import fnmatch
import uuid

from actors.cli.operator import render
from actors.cli.operator.connect import Backend
from actors.cli.operator.options import Commands
from actors.cli.operator.running import Result
from actors.operator import BadInput, NotFound


async def jobs(backend: Backend, args: argparse.Namespace) -> Result:
    rows = await backend.get("jobs")
    rows = rows if args.all else [j for j in rows if j.enabled]
    if args.pattern:
        rows = [j for j in rows if _name_matches(j.name, args.pattern)]
    # `--json` prints the API's job list as it is; the table adds the jobs the
    # config file rejected (GET /api/config/rejected), new ones included.
    rejected = [] if args.json else await backend.get("rejected_jobs")
    if args.pattern:
        rejected = [r for r in rejected if _name_matches(r.job, args.pattern)]
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
        if not page.runs:
            raise NotFound(
                f"job {run_id!r} has no run yet (claimd runs {run_id} --ahead lists "
                "the ones written ahead)"
            )
        run_id = page.runs[0].id
    found = await backend.get("run", run_id=run_id)
    return found, render.run(found), 0


async def audit(backend: Backend, args: argparse.Namespace) -> Result:
    if args.at and (args.start or args.end):
        raise BadInput("give --at, or --from and --to, not both")
    if not args.at and not (args.start and args.end):
        raise BadInput("give --from and --to (a range), or --at (one instant)")
    start, end = (args.at, args.at) if args.at else (args.start, args.end)
    result = await backend.get("audit", job=args.job, start=start, end=end)
    return (result, render.audit(result, args.problems), 0 if result.summary.complete else 1)


async def actions(backend: Backend, args: argparse.Namespace) -> Result:
    rows = await backend.get("actions", job=args.job, limit=args.limit)
    return rows, render.actions(rows), 0


def add_jobs(commands: Commands) -> None:
    """`claimd jobs [PATTERN]`."""
    p = commands.add(
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


def add_runs(commands: Commands) -> None:
    """`claimd runs [JOB]`."""
    p = commands.add(
        "runs", "runs that have happened (scheduled at or before now), newest first", runs
    )
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


def add_show(commands: Commands) -> None:
    """`claimd show RUN_ID|JOB`."""
    p = commands.add(
        "show",
        "one run (by RUN_ID, or JOB's latest): attempts and verdicts, errors, output tail, "
        "lease, epoch",
        show,
    )
    p.add_argument(
        "run_id", metavar="RUN_ID|JOB", help="a run's id, or a job's name: its latest run"
    )


def add_audit(commands: Commands) -> None:
    """`claimd audit JOB`."""
    p = commands.add(
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


def add_actions(commands: Commands) -> None:
    """`claimd actions`."""
    p = commands.add("actions", "operator actions: who, when, what, arguments, result", actions)
    p.add_argument("--job")
    p.add_argument("--limit", type=int, default=50)

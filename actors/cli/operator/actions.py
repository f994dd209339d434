"""The operator's actions: pause, resume, trigger (and its --wait), cancel, backfill."""

from __future__ import annotations

import argparse
import asyncio
import sys

from actors.cli.operator import render
from actors.cli.operator.connect import Backend
from actors.cli.operator.options import TIME_NOTE, Commands, overlap_option, positive_int
from actors.cli.operator.running import Command, Result
from actors.clocks import Deadline
from actors.domain.backfill import BACKFILL_CHUNK, BACKFILL_MAX_RUNS
from actors.domain.pause import DEFAULT_PAUSED_INSTANTS, PausedInstants
from actors.domain.trigger import EARLIEST_TRIGGER
from actors.operator import OperatorError


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
    deadline = Deadline.within(args.wait_timeout)
    while True:
        run = await backend.get("run", run_id=answer["run_id"])
        if run.state not in render.UNFINISHED:
            return run, render.run(run), 0 if run.state == "succeeded" else 1
        if deadline.passed():
            raise WaitTimedOut(
                f"run {answer['run_id']} still {run.state} after {args.wait_timeout}s "
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


def add_pause(commands: Commands) -> None:
    """`claimd pause JOB`."""
    commands.add(
        "pause",
        "stop materializing and claiming a job's runs (claimed, unstarted ones go back to pending)",
        _action("pause", "job"),
    ).add_argument("job")


def add_resume(commands: Commands) -> None:
    """`claimd resume JOB`."""
    p = commands.add("resume", "undo pause", _resume)
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


def add_trigger(commands: Commands) -> None:
    """`claimd trigger JOB`."""
    p = commands.add(
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
    overlap_option(p)
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the run to finish, then show it (exit 0 succeeded, 1 otherwise)",
    )
    p.add_argument(
        "--wait-timeout",
        type=positive_int,
        default=3600,
        metavar="SECONDS",
        help="give up waiting after this long (exit 5; the run goes on); default 3600",
    )


def add_cancel(commands: Commands) -> None:
    """`claimd cancel RUN_ID`."""
    commands.add(
        "cancel", "cancel a pending or running run", _action("cancel", "run_id")
    ).add_argument("run_id")


def add_backfill(commands: Commands) -> None:
    """`claimd backfill JOB`."""
    p = commands.add(
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
        type=positive_int,
        default=BACKFILL_MAX_RUNS,
        help=f"refuse a range of more instants than this (default {BACKFILL_MAX_RUNS:,})",
    )
    overlap_option(p)

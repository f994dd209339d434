"""What an operator can do: pause, resume, trigger, cancel, backfill; each one recorded.

An action and its record in ``operator_actions`` commit in one transaction
(a backfill, many short statements, is recorded when it ends). A refusal is
recorded too, with why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from actors.domain import Overlap, decode_job
from actors.domain.backfill import BACKFILL_MAX_RUNS, BackfillProgress, BackfillTooLarge
from actors.domain.pause import DEFAULT_PAUSED_INSTANTS, PausedInstants
from actors.domain.trigger import TriggerRefused, judge_backfill, judge_trigger, run_overlap
from actors.observability import get_logger
from actors.operator.errors import (
    BadInput,
    NotFound,
    NothingToDo,
    OperatorError,
    Unprocessable,
)
from actors.operator.reads import OperatorReads
from actors.operator.shapes import (
    iso,
    parse_time,
    resume_words,
    run_id_of,
    schedule_of,
    zone_named,
)
from actors.ports import Action, ActiveRun, Caller, Recorded, Unchanged, UnknownJob

log = get_logger("operator")


class OperatorService(OperatorReads):
    """Reads and actions over the operator's port, as the CLI and the API offer them."""

    async def _record_refusal(
        self, actor: Caller, action: str, error: OperatorError, **fields: Any
    ) -> None:
        await self.history.record_action(actor, Action(action, False, str(error), **fields))

    async def pause(self, actor: Caller, job: str) -> dict[str, Any]:
        message = f"paused {job}"
        done = await self.history.pause(actor, job, result=message)
        if isinstance(done, Recorded):
            return self._done(done, actor, "pause", message, job=job)
        await self._refuse_unchanged(actor, "pause", job, done, None)

    async def resume(
        self, actor: Caller, job: str, paused_instants: str | None = None
    ) -> dict[str, Any]:
        """Undo pause; ``paused_instants`` says what becomes of the instants due meanwhile.

        ``skip`` (the default): none runs, each recorded as skipped or as a gap
        with the reason "paused ..."; ``run``: the job's catch-up policy decides,
        as after a downtime (with catchup = all they all run at once). See
        actors.domain.pause.
        """
        choice = paused_instants or DEFAULT_PAUSED_INSTANTS.value
        arguments = {"paused_instants": choice}
        if choice not in {c.value for c in PausedInstants}:
            error = BadInput(f"paused_instants must be run or skip, got {choice!r}")
            await self._record_refusal(actor, "resume", error, job=job, arguments=arguments)
            raise error
        how = PausedInstants(choice)
        done = await self.history.resume(
            actor,
            job,
            how,
            arguments=arguments,
            result=lambda resumed: resume_words(job, how, resumed)[0],
        )
        if isinstance(done, Unchanged):
            await self._refuse_unchanged(actor, "resume", job, done, arguments)
        resumed, recorded = done
        message, extra = resume_words(job, how, resumed)
        return self._done(recorded, actor, "resume", message, job=job, extra=extra)

    async def _refuse_unchanged(
        self,
        actor: Caller,
        action: str,
        job: str,
        why: Unchanged,
        arguments: dict[str, Any] | None,
    ) -> NoReturn:
        error: OperatorError = (
            NotFound(f"no enabled job named {job!r}")
            if why is Unchanged.UNKNOWN_JOB
            else NothingToDo(f"{job} is already {'paused' if action == 'pause' else 'running'}")
        )
        await self._record_refusal(actor, action, error, job=job, arguments=arguments)
        raise error

    @staticmethod
    def _run_overlap(job: str, definition: str, asked: str | None) -> Overlap:
        """The overlap mode an operator's new runs of ``job`` carry (Unprocessable: a mode
        the job does not offer)."""
        try:
            return run_overlap(job, decode_job(job, definition).overlap, asked)
        except TriggerRefused as refused:
            raise Unprocessable(str(refused)) from None

    async def trigger(
        self, actor: Caller, job: str, at: str | None = None, overlap: str | None = None
    ) -> dict[str, Any]:
        """A run of ``job`` for the instant ``at`` (default: the database's now), due now.

        Only an instant at or before now on the database's clock, and not before
        EARLIEST_TRIGGER: a future instant's row would run today and take the
        place of that instant's scheduled run (see actors.domain.trigger). The
        answer says whether the schedule names the instant.

        ``overlap`` (a job with overlap = forbid or queue): the run's own mode,
        ``queue`` by default (it waits while another run of the job is active,
        and the answer names that run), ``allow``, or ``forbid``, refused while
        a run of the job is active (it would be skipped) instead of skipped
        silently.
        """
        arguments: dict[str, Any] = {"at": at, "overlap": overlap}
        try:
            row = await self._job_row(job)
            now = row["now"]
            instant = parse_time(at, zone_named(row["timezone"]), now, "at") if at else now
            try:
                scheduled = judge_trigger(job, schedule_of(row["definition"], job), instant, now)
            except TriggerRefused as refused:
                raise Unprocessable(f"at {refused}") from None
            chosen = self._run_overlap(job, row["definition"], overlap)
            active = None if chosen is Overlap.ALLOW else await self.history.active_run(job)
            if chosen is Overlap.FORBID and active is not None:
                raise Unprocessable(
                    f"{job} has run {active.run_id} {active.state} and overlap forbid: a run "
                    "triggered now would be skipped; nothing added (overlap queue runs it "
                    "after that run, allow beside it)"
                )
        except OperatorError as bad:
            await self._record_refusal(actor, "trigger", bad, job=job, arguments=arguments)
            raise
        arguments.update({"instant": iso(instant), "overlap": chosen.value})
        waits = _waits(job, chosen, active)
        what = (
            f"a scheduled instant of {job}" if scheduled else f"not an instant of {job}'s schedule"
        )
        # Said in the answer, because the two differ in what follows: the run of a
        # scheduled instant is that instant's run (the schedule adds no other),
        # while any other instant is an extra run.
        effect = (
            "this run is that instant's run; the schedule adds no other"
            if scheduled
            else "an extra run"
        )

        def message(run_id: str) -> str:
            return f"triggered {job}: run {run_id} at {iso(instant)} ({what}: {effect}){waits}"

        error: OperatorError
        try:
            done = await self.history.trigger(
                actor, job, instant, arguments=arguments, result=message, overlap=chosen
            )
        except UnknownJob:
            done, error = None, NotFound(f"no enabled job named {job!r}")
        else:
            error = NothingToDo(
                f"{job} already has a run at {iso(instant)} ({what}); nothing added"
            )
        if done is not None:
            run_id, recorded = done
            return self._done(
                recorded,
                actor,
                "trigger",
                message(run_id),
                job=job,
                run_id=run_id,
                extra={
                    "scheduled_at": iso(instant),
                    "scheduled_instant": scheduled,
                    "overlap": chosen.value,
                    "waits_for": active.run_id if active and chosen is Overlap.QUEUE else None,
                },
            )
        await self._record_refusal(actor, "trigger", error, job=job, arguments=arguments)
        raise error

    async def backfill(
        self,
        actor: Caller,
        job: str,
        start: str,
        end: str,
        *,
        max_runs: int = BACKFILL_MAX_RUNS,
        progress: Callable[[BackfillProgress], None] | None = None,
        overlap: str | None = None,
    ) -> dict[str, Any]:
        """One run per instant of the schedule in ``[start, end]`` that has no row yet.

        Idempotent: a range whose instants all have a row adds nothing and is
        still done (running it again is how an interrupted backfill finishes).
        Written in chunks that commit one by one, so the action is recorded
        when the last one has.

        Every instant added runs. ``overlap`` (a job with overlap = forbid or
        queue) is the runs' own mode, written on each row: ``queue`` by default
        (one after another, each waiting while a run of the job is active),
        ``allow`` (at once), or ``forbid`` (as the job's own runs: skipped if a
        run is active when due).
        """
        arguments: dict[str, Any] = {
            "from": start,
            "to": end,
            "max_runs": max_runs,
            "overlap": overlap,
        }
        try:
            if max_runs < 1:
                raise BadInput(f"max_runs must be a positive whole number, got {max_runs}")
            row = await self._job_row(job)
            chosen = self._run_overlap(job, row["definition"], overlap)
            arguments["overlap"] = chosen.value
            zone = zone_named(row["timezone"])
            first, last = (
                parse_time(start, zone, row["now"], "from"),
                parse_time(end, zone, row["now"], "to"),
            )
            try:
                judge_backfill(job, first, last, row["now"])
            except TriggerRefused as refused:
                raise Unprocessable(str(refused)) from None
            arguments.update({"from_instant": iso(first), "to_instant": iso(last)})
            try:
                done = await self.history.backfill(
                    job, first, last, max_runs=max_runs, progress=progress, overlap=chosen
                )
            except UnknownJob:
                raise NotFound(f"no enabled job named {job!r}") from None
            except BackfillTooLarge as exc:
                raise Unprocessable(
                    f"{exc} (from {iso(first)} to {iso(last)}); nothing "
                    "added: split the range or raise --max-runs (max_runs "
                    "in the API)"
                ) from None
        except OperatorError as bad:
            await self._record_refusal(actor, "backfill", bad, job=job, arguments=arguments)
            raise
        message = (
            f"backfilled {job}: {done.instants:,} instants from {iso(first)} to "
            f"{iso(last)}: {done.added:,} runs added, {done.existing:,} already had "
            f"a run{_backfill_words(job, row['definition'], chosen)}"
        )
        recorded = await self.history.record_action(
            actor, Action("backfill", True, message, job=job, arguments=arguments)
        )
        return self._done(
            recorded,
            actor,
            "backfill",
            message,
            job=job,
            extra={
                "added": done.added,
                "existing": done.existing,
                "instants": done.instants,
                "overlap": chosen.value,
            },
        )

    async def cancel(self, actor: Caller, run_id: str) -> dict[str, Any]:
        """Cancel a pending or running run; a finished one is left as it is."""
        try:
            ident = run_id_of(run_id)
        except OperatorError as bad:
            await self._record_refusal(actor, "cancel", bad, arguments={"run_id": run_id})
            raise
        message = f"cancelled {ident}"
        found = await self.history.cancel(
            actor, ident, reason=f"cancelled by {actor.name}", result=message
        )
        if found.recorded is not None:
            return self._done(found.recorded, actor, "cancel", message, job=found.job, run_id=ident)
        state = found.state
        error = (
            NotFound(f"no run {ident}")
            if state is None
            else NothingToDo(f"run {ident} is {state}; nothing to cancel")
        )
        await self._record_refusal(
            actor,
            "cancel",
            error,
            run_id=ident if state is not None else None,
            arguments={"run_id": ident},
        )
        raise error

    @staticmethod
    def _done(
        recorded: Recorded,
        actor: Caller,
        action: str,
        message: str,
        *,
        job: str | None = None,
        run_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The answer to an action that happened (its record written with it)."""
        log.debug(
            "operator action",
            action=action,
            job=job,
            run_id=run_id,
            actor=actor.name,
            via=actor.via,
        )
        return {
            "action": action,
            "job": job,
            "run_id": run_id,
            "message": message,
            "action_id": recorded.action_id,
            "at": iso(recorded.at),
            "actor": actor.name,
            **(extra or {}),
        }


def _waits(job: str, chosen: Overlap, active: ActiveRun | None) -> str:
    """What a triggered run of an exclusive job does about the run active now, in words."""
    if active is None:
        return "" if chosen is Overlap.ALLOW else f"; overlap {chosen.value}"
    if chosen is Overlap.QUEUE:
        return f"; overlap queue: it waits its turn, {job}'s run {active.run_id} is {active.state}"
    return f"; overlap {chosen.value}"


def _backfill_words(job: str, definition: str, chosen: Overlap) -> str:
    """How a backfill's runs of a job with overlap = forbid or queue will run, in words."""
    if decode_job(job, definition).overlap is Overlap.ALLOW:
        return ""
    return {
        Overlap.QUEUE: "; overlap queue: they run one after another",
        Overlap.ALLOW: "; overlap allow: they may run at once",
        Overlap.FORBID: f"; overlap forbid: each is skipped if a run of {job} is active when due",
    }[chosen]

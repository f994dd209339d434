"""Why a delivered run did not start, and why a due run was skipped, in the words we keep.

Both stores decide these (PostgreSQL in its statements, the in-memory store on
its rows); the words come from here, so logs, metrics labels and the history
read the same whichever store wrote them. ``str`` enums: a value compares and
formats as its word.
"""

from __future__ import annotations

import enum

from actors.domain.runs import RunState


class StartRefusal(enum.StrEnum):
    """Why a start changed nothing for one delivered message (``NotStarted.reason``)."""

    # Finished already (succeeded, failed, skipped, cancelled): ack, nothing to do.
    TERMINAL = "terminal"
    # Running under this epoch and not handed back for a retake: left to its lease.
    OWNED = "owned"
    # The message's epoch is not the run's (re-claimed since), or its claim was
    # handed back (released, reaped, paused): a later message carries the run.
    STALE = "stale"
    # No such run (withdrawn by a schedule change, or not this database's): never redeliver.
    UNKNOWN = "unknown"
    # Started, and failed at once on the record: this build cannot read its definition.
    UNREADABLE = "unreadable"
    # Judged again at the start and found unrunnable (deadline, catchup = latest).
    SKIPPED = "skipped"
    # Claimed ahead and not yet due on the database's clock: the worker holds it longer.
    EARLY = "early"


def refusal_of(state: RunState | None, epoch: int | None, message_epoch: int) -> StartRefusal:
    """Why a message under ``message_epoch`` started nothing, from its run as read after
    the start (RUN_STATES): ``state`` and ``epoch`` None when there is no such run.

    Only for runs the start neither started nor judged (skipped, unreadable).
    """
    if state is None:
        return StartRefusal.UNKNOWN
    if state.terminal:
        return StartRefusal.TERMINAL
    if epoch != message_epoch:
        return StartRefusal.STALE
    if state is RunState.RUNNING:
        return StartRefusal.OWNED
    if state is RunState.CLAIMED:
        # Claimed under this epoch and not started: not yet due (claimed ahead).
        return StartRefusal.EARLY
    return StartRefusal.STALE


class SkipReason(enum.StrEnum):
    """Why a due run was recorded skipped (its ``error``): what a policy said.

    The SQL statements carry the same words as literals (they import nothing);
    tests/unit/test_refusals.py checks that each word is in them.
    """

    DEADLINE_MISSED = "missed its starting deadline"
    SUPERSEDED = "superseded by a later instant (catchup = latest)"
    OVERLAP_FORBIDDEN = "overlap forbidden: an earlier run was still active"

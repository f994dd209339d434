"""What a request may carry: the path, query and body of each operation, as pydantic models.

The server reads every request through these models (actors/http/api/reading.py)
and the document's parameters and request bodies are their JSON schemas, so
what /openapi.json allows is what the server accepts. A query value arrives as
text: integers are decimal digits only, flags are ``true`` or ``false``.
Unknown query parameters are ignored; a body's unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from actors.domain.backfill import BACKFILL_MAX_RUNS
from actors.http.openapi.fields import (
    FROM_QUERY_TEXT,
    MAX_BIGINT,
    MAX_GRID,
    MAX_PAGE,
    WHOLE_NUMBER,
    Cursor,
    JobName,
    QueryBool,
    RunId,
    States,
    Time,
)


class _Parameters(BaseModel):
    """Path or query parameters: strict once converted from text; others are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class _Body(BaseModel):
    """A JSON object body: strict JSON types, no field the model does not name."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


# --- path ------------------------------------------------------------------------------


class JobPath(_Parameters):
    name: JobName


class RunPath(_Parameters):
    run_id: RunId


# --- query -----------------------------------------------------------------------------

PageSize = Annotated[int, Field(ge=1, le=MAX_PAGE), FROM_QUERY_TEXT]


class JobQuery(_Parameters):
    recent: Annotated[int, Field(ge=0, le=MAX_PAGE), FROM_QUERY_TEXT] = Field(
        20, description="how many recent runs"
    )


class AuditQuery(_Parameters):
    start: Time = Field(alias="from", description="the first instant")
    end: Time = Field(alias="to", description="the last instant (inclusive)")


class RunsQuery(_Parameters):
    job: JobName | None = Field(None, description="only this job's runs")
    state: list[States] = Field(
        [],
        description="only runs in these states: repeat the parameter, or separate states "
        "with commas",
    )
    since: Time | None = Field(None, description="scheduled at or after")
    until: Time | None = Field(None, description="scheduled at or before")
    limit: PageSize = Field(50, description="page size")
    cursor: Cursor | None = None
    ahead: QueryBool = Field(
        False,
        description="true: include the runs written ahead of time, not yet due (default: "
        "what has happened, scheduled at or before now)",
    )


class ActionsQuery(_Parameters):
    job: JobName | None = Field(None, description="only this job's actions")
    limit: PageSize = Field(50, description="page size")
    before: Annotated[int, Field(ge=1, le=MAX_BIGINT), FROM_QUERY_TEXT] | None = Field(
        None, description="only ids below this (the id of the last one seen)"
    )


class GridQuery(_Parameters):
    instants: Annotated[int, Field(ge=1, le=MAX_GRID), FROM_QUERY_TEXT] = Field(
        30, description="how many of each job's last instants"
    )
    job: JobName | None = Field(None, description="only this job")


# --- bodies ----------------------------------------------------------------------------


class ResumeBody(_Body):
    """What becomes of the instants that came due while the job was paused."""

    paused_instants: Literal["run", "skip"] | None = Field(
        None,
        description='skip (default): none runs, each recorded with the reason "paused"; '
        "run: as the job's catch-up policy says (catchup = all runs them all at once)",
    )


RunOverlap = Literal["queue", "allow", "forbid"]
OVERLAP_WORDS = (
    "the new runs' own overlap mode, for a job with overlap = forbid or queue: queue "
    "(the default: each waits while another run of the job is active, so a backfill's "
    "runs run one after another), allow (beside the others), or forbid (a forbid job's "
    "only: skipped if a run is active when due). A job with overlap = allow takes only "
    "allow; anything else is 422."
)


class TriggerBody(_Body):
    """A run now, for the instant ``at``; an empty body (or none) means now."""

    at: Time | None = Field(
        None,
        description="the instant (absent or null: now). It must be at or before now on the "
        "database's clock and not before 2000-01-01, otherwise 422: a future instant would "
        "run now and use up that instant's scheduled run.",
    )
    overlap: RunOverlap | None = Field(
        None,
        description=OVERLAP_WORDS + " For a trigger, forbid is refused (422) while a run of "
        "the job is active, instead of adding a run that would be skipped.",
    )


class BackfillBody(_Body):
    """One run per instant of the schedule in [from, to] that has no row yet."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"from": "2026-01-01 00:00", "to": "2026-01-07 23:59"}]}
    )

    start: Time = Field(alias="from", description="the first instant")
    end: Time = Field(alias="to", description="the last instant (inclusive)")
    max_runs: Annotated[int, Field(ge=1, le=MAX_BIGINT), WHOLE_NUMBER] = Field(
        BACKFILL_MAX_RUNS,
        description="refuse a range of more instants than this (422); default 1,000,000",
    )
    overlap: RunOverlap | None = Field(None, description=OVERLAP_WORDS)

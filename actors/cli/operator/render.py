"""Tables for a terminal from the operator's read models (actors.operator.models), whichever
way the command reached claimd; ``--json`` prints the models as the API sends them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from actors.domain import human_duration
from actors.operator.models import (
    Audit,
    ConfigRollout,
    Job,
    LastOutcome,
    RejectedJob,
    RunDetail,
    RunsPage,
)

MAX_CELL = 60
UNFINISHED = ("pending", "claimed", "running")


# What a terminal would act on rather than show: C0 controls but newline and
# tab (ESC starts colour, cursor and title sequences; CR overwrites a line),
# DEL, the C1 controls (U+009B is a one-character CSI) and the bidirectional
# overrides that reorder what is shown. Job output and errors are the job's
# text, not ours: they are shown escaped, never interpreted.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character a terminal would act on written as an escape."""
    return _CONTROLS.sub(_escaped, text)


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else terminal_safe(str(value))
    text = " ".join(text.split())  # one line per row, whatever the error looked like
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def when(value: str | None) -> str:
    """An ISO 8601 instant, shorter: seconds, 'Z' for UTC."""
    if not value:
        return "-"
    parsed = datetime.fromisoformat(value)
    text = parsed.replace(microsecond=0).isoformat(sep=" ")
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


def took(seconds: float | None) -> str:
    """``5s``, ``2m 5s``: never ``0:00:05``."""
    return "-" if seconds is None else human_duration(timedelta(seconds=seconds))


def json_ready(payload: Any) -> Any:
    """What ``--json`` prints: a read model (or a list of them) as the API sends it."""
    if isinstance(payload, BaseModel):
        return payload.model_dump(mode="json", by_alias=True)
    if isinstance(payload, list):
        return [json_ready(p) for p in payload]
    return payload


def _outcome(last: LastOutcome | None, running: int = 0, width: int | None = None) -> str:
    if last is None:
        # The first run of a long job is running, not "never ran".
        return "running, none finished yet" if running else "never ran"
    text = str(last.outcome or last.state)
    if not last.error:
        return text
    error = " ".join(last.error.split())
    if width is not None and len(error) > width:
        error = error[: width - 1] + "…"
    return f"{text}: {error}"


NARROW_ERROR = 60  # characters of the last error in the default (narrow) table


def _job_state(j: Job) -> str:
    """The job's state as the API decided it (actors.domain.job_state), and a rejected
    edit where the state says something else first."""
    state = str(j.state)
    if j.config_rejected is not None and j.state != "rejected":
        return f"{state}, edit rejected"
    return state


def jobs(
    rows: Sequence[Job],
    rejected: Sequence[RejectedJob] = (),
    config: ConfigRollout | None = None,
    *,
    wide: bool = False,
) -> str:
    """The jobs table; the config generation in force and the replicas' files; then the
    jobs the config file rejected, each with its error (last: a script reads to the end).

    Narrow by default (a terminal's width: the job, its schedule in its zone,
    the next fire in that zone, the last outcome with the error cut short, the
    backlog, the state); ``wide`` adds UTC times, the last success and the runs
    written ahead, and the whole error.
    """
    listed = {j.name for j in rows}
    new = [r for r in rejected if r.job not in listed]
    if not rows and not rejected:
        return "no jobs"
    if not wide:
        narrow = [
            [
                j.name,
                j.schedule if j.timezone in j.schedule else f"{j.schedule} ({j.timezone})",
                when(j.next_fire_local),
                _outcome(j.last_outcome, j.running, NARROW_ERROR),
                "-" if j.paused else j.overdue,
                _job_state(j),
            ]
            for j in rows
        ]
        narrow += [[r.job, *["-"] * 4, "rejected"] for r in new]
        text = table(["JOB", "SCHEDULE", "NEXT FIRE", "LAST OUTCOME", "OVERDUE", "STATE"], narrow)
        return text + config_lines(config) + _rejected_lines(rejected)
    body = [
        [
            j.name,
            j.schedule,
            j.timezone,
            when(j.next_fire),
            when(j.next_fire_local),
            _outcome(j.last_outcome, j.running),
            when(j.last_success),
            "-" if j.paused else j.overdue,
            "-" if j.paused else j.backlog,
            j.ahead,
            _job_state(j),
        ]
        for j in rows
    ]
    body += [[r.job, *["-"] * 9, "rejected"] for r in new]
    text = table(
        [
            "JOB",
            "SCHEDULE",
            "ZONE",
            "NEXT FIRE (UTC)",
            "NEXT FIRE (LOCAL)",
            "LAST OUTCOME",
            "LAST SUCCESS (UTC)",
            "OVERDUE",
            "BACKLOG",
            "AHEAD",
            "STATE",
        ],
        body,
    )
    return text + config_lines(config) + _rejected_lines(rejected)


def _rejected_lines(rejected: Sequence[RejectedJob]) -> str:
    if not rejected:
        return ""
    lines = ["", "rejected by the config file (fix the file, then `claimd reload`):"]
    for r in rejected:
        field = f"field {r.field!r}: " if r.field else ""
        verdict = "the old definition keeps running" if r.old_definition_running else "not running"
        error = " ".join(r.error.split())
        lines.append(f"  {r.job}: {r.path}: {field}{error} -- {verdict}")
    return "\n" + "\n".join(lines)


def config_lines(config: ConfigRollout | None) -> str:
    """Under the jobs table: the config generation in force and each replica's file."""
    if config is None or config.in_force is None:
        return ""
    g = config.in_force
    version = f", config_version {g.config_version}" if g.config_version is not None else ""
    forced = ", forced (rollback)" if g.forced else ""
    lines = [
        "",
        f"config in force: generation {g.generation}, digest {g.digest}{version}, since "
        f"{when(g.since)}{forced}",
    ]
    if config.disagreement:
        lines.append(config.disagreement)
    for r in config.replicas:
        state = (
            "in force"
            if r.in_force
            else ("refused: older than the one in force" if r.stale else "not in force")
        )
        lines.append(f"  {terminal_safe(r.replica)}: digest {r.digest} ({state})")
    return "\n".join(lines)


def runs(page: RunsPage) -> str:
    rows = page.runs
    if not rows:
        return "no runs"
    text = table(
        [
            "RUN",
            "JOB",
            "SCHEDULED (UTC)",
            "SCHEDULED (LOCAL)",
            "STATE",
            "ATTEMPT",
            "TRIGGER",
            "ERROR",
        ],
        [
            [
                r.id,
                r.job,
                when(r.scheduled_at),
                when(r.scheduled_local),
                r.state,
                r.attempt,
                r.trigger,
                r.error,
            ]
            for r in rows
        ],
    )
    if page.next_cursor:
        text += f"\n(more: --cursor '{page.next_cursor}')"
    return text


def run(r: RunDetail) -> str:
    lease = (
        f"{r.lease_owner} until {when(r.lease_expires_at)}"
        + (" (EXPIRED)" if r.lease_expired else "")
        if r.lease_owner
        else "-"
    )
    outcome, error = r.outcome, r.error
    if r.state in UNFINISHED and r.attempt > 1 and (outcome or error):
        # The run row keeps the previous attempt's verdict until this one's.
        outcome = f"none yet (attempt {r.attempt - 1}: {outcome or '-'})"
        error = f"attempt {r.attempt - 1}: {error}" if error else None
    fields: list[tuple[str, Any]] = [
        ("run", r.id),
        ("job", r.job),
        ("scheduled", f"{when(r.scheduled_at)}  ({when(r.scheduled_local)} {r.timezone})"),
        ("state", r.state),
        ("outcome", outcome),
        ("error", error),
        ("trigger", r.trigger),
        ("attempt", r.attempt),
        ("claim epoch", r.claim_epoch),
        ("lease", lease),
        ("due", when(r.due_at)),
        ("started", when(r.started_at)),
        ("finished", when(r.finished_at)),
        ("exit code", r.exit_code),
    ]
    lines = [f"{k + ':':<13}{'-' if v is None else v}" for k, v in fields]
    attempts = r.attempts
    lines.append("")
    lines.append(
        table(
            [
                "ATTEMPT",
                "EPOCH",
                "WORKER",
                "STARTED (UTC)",
                "FINISHED (UTC)",
                "TOOK",
                "VERDICT",
                "EXIT",
                "ERROR",
            ],
            [
                [
                    a.attempt,
                    a.claim_epoch,
                    a.worker,
                    when(a.started_at),
                    when(a.finished_at),
                    took(a.duration_s),
                    a.outcome,
                    a.exit_code,
                    a.error,
                ]
                for a in attempts
            ],
        )
        if attempts
        else "no attempt has started"
    )
    # Each attempt's own output (sql/0014); attempts recorded before kept none:
    # then the run's, which is its latest attempt's.
    for a in attempts:
        if a.output_tail:
            lines += [
                "",
                f"output of attempt {a.attempt} (epoch {a.claim_epoch}, tail):",
                a.output_tail.rstrip("\n"),
            ]
    if not any(a.output_tail for a in attempts) and r.output_tail:
        lines += ["", "output (tail):", r.output_tail.rstrip("\n")]
    return "\n".join(lines)


def audit(result: Audit, problems_only: bool = False) -> str:
    entries = [e for e in result.entries if e.problem or not problems_only]
    head = (
        f"audit of {result.job} from {when(result.start)} to {when(result.end)} "
        f"(zone {result.timezone}: {when(result.from_local)} to "
        f"{when(result.to_local)})"
    )
    if result.due_since and result.due_since > result.start:
        head += (
            f"\ninstants before {when(result.due_since)} were never due (the schedule began then)"
        )
    body = table(
        ["", "SCHEDULED (UTC)", "SCHEDULED (LOCAL)", "STATUS", "RUN", "WHY"],
        [
            [
                "!" if e.problem else " ",
                when(e.scheduled_at),
                when(e.scheduled_local),
                e.status,
                e.run.id if e.run else None,
                e.reason,
            ]
            for e in entries
        ],
    )
    return "\n".join([head, body if entries else "(no instants to show)", result.summary.line])


def actions(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no operator actions recorded"
    return table(
        ["ID", "AT (UTC)", "ACTOR", "VIA", "ACTION", "JOB", "RUN", "OK", "RESULT"],
        [
            [
                a["id"],
                when(a["at"]),
                a["actor"],
                a["via"],
                a["action"],
                a["job"],
                a["run_id"],
                "yes" if a["ok"] else "no",
                a["result"],
            ]
            for a in rows
        ],
    )

"""What `claimd check-config` prints for a job's next fire times, DST changes marked.

A fire time within two hours of a change of the zone's UTC offset, or one
that the DST rule placed (a repeated or skipped wall time), carries its
offset and the rule applied; a wall time the rule does not run at is listed
as skipped, with the reason. Read from the schedule itself
(``CronSchedule.dst_notes``), so what is shown is what the materializer plans.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from actors.domain import CronSchedule, DstNote, IntervalSchedule, take

NEAR = timedelta(hours=2)


def _offset(moment: datetime, zone: tzinfo) -> str:
    return moment.astimezone(zone).isoformat()[-6:]


def job_fire_times(
    schedule: CronSchedule | IntervalSchedule, start: datetime, count: int
) -> dict[str, Any]:
    """The next ``count`` fire times after ``start``, and the skipped wall times among them."""
    zone: tzinfo = schedule.zone if isinstance(schedule, CronSchedule) else UTC
    far = start.replace(year=start.year + 10)
    instants = take(schedule.fire_times(start, far), count)
    fires: list[dict[str, Any]] = [
        {
            "utc": t.isoformat(),
            "local": t.astimezone(zone).isoformat(),
            "offset": _offset(t, zone),
            "dst": None,
        }
        for t in instants
    ]
    skipped: list[dict[str, Any]] = []
    if isinstance(schedule, CronSchedule) and instants:
        _mark(schedule, start, instants, fires, skipped)
    return {"fires": fires, "skipped": skipped}


def _mark(
    schedule: CronSchedule,
    start: datetime,
    instants: list[datetime],
    fires: list[dict[str, Any]],
    skipped: list[dict[str, Any]],
) -> None:
    zone = schedule.zone
    end = instants[-1]
    notes = schedule.dst_notes(start, end)
    by_instant: dict[datetime, DstNote] = {t: n for n in notes for t in n.fired}
    changes = schedule.offset_changes(start - NEAR, end + NEAR)
    for t, fire in zip(instants, fires, strict=True):
        note = by_instant.get(t)
        if note is not None:
            fire["dst"] = {"kind": note.kind, "wall": note.wall.isoformat(), "rule": note.rule}
            if note.kind == "fold":
                fire["dst"]["occurrence"] = 1 if t == note.at else 2
        elif any(abs(t - at) <= NEAR for at, _, _ in changes):
            fire["dst"] = {
                "kind": "near",
                "wall": t.astimezone(zone).replace(tzinfo=None).isoformat(),
                "rule": "an ordinary wall time (occurs once)",
            }
    # Skipped: a gap's wall times that do not run, a fold's occurrences that do
    # not, within the fire times shown; grouped by change and rule.
    groups: dict[tuple[str, datetime, str], list[DstNote]] = {}
    for note in notes:
        if (note.kind == "gap" and not note.fired and start < note.at <= end) or any(
            start < missed <= end for missed in note.missed
        ):
            groups.setdefault((note.kind, note.change, note.rule), []).append(note)
    for (kind, at, rule), group in groups.items():
        skipped.append(
            {
                "kind": kind,
                "first": group[0].wall.isoformat(),
                "last": group[-1].wall.isoformat(),
                "count": len(group),
                "change_at": at.isoformat(),
                "rule": rule,
            }
        )


def text_lines(record: dict[str, Any]) -> list[str]:
    """The indented lines of one job: each fire time (UTC, local), then what was skipped."""
    lines: list[str] = []
    for fire in record["fires"]:
        line = f"  {fire['utc']}  {fire['local']}"
        dst = fire["dst"]
        if dst is not None:
            which = f" {dst['occurrence']} of 2" if "occurrence" in dst else ""
            line += f"  [dst {dst['kind']}{which}, offset {fire['offset']}: {dst['rule']}]"
        lines.append(line)
    for skip in record["skipped"]:
        walls = skip["first"] if skip["count"] == 1 else f"{skip['first']}..{skip['last']}"
        lines.append(
            f"  skipped {walls} ({skip['count']} slot{'s' if skip['count'] > 1 else ''}, "
            f"dst {skip['kind']} at {skip['change_at']}): {skip['rule']}"
        )
    return lines

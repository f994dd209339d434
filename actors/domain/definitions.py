"""The one codec for stored job definitions (``jobs.definition``).

Every reader of a stored definition (the materializer, the worker's start,
check-config, the operator's reads, backfill) decodes it here, and the job
catalog stores what :func:`encode_job` writes. The format carries a version:
a row without one is version 1 (rows written before the field existed); a
newer version than this build reads is refused with a clear error rather
than guessed at.

A field a stored definition lacks reads as its default, the one the config
file and the domain have (actors.domain.defaults). Every claimd build has
written every field but the secret ones (``secret_env``, ``secret_headers``:
absent means none) and ``inherit_env`` (written only when not empty, so the
fingerprints of the jobs without it did not change when it came; absent
means none; a build before it ignores it and passes its whole environment),
so this matters only for a row written by other means;
before the defaults were declared once, such a row without ``expect_status``
read as ``(200,)`` where the config's default was 200, 201, 202 and 204, and
now reads as the latter too.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from datetime import timedelta
from functools import lru_cache
from typing import Any

from actors.domain import defaults
from actors.domain.attempts import RetryPolicy
from actors.domain.jobs import (
    Catchup,
    ExecutorSpec,
    HttpSpec,
    Job,
    Overlap,
    PythonSpec,
    ShellSpec,
)
from actors.domain.schedule import CronSchedule, IntervalSchedule
from actors.domain.sharing import shared
from actors.domain.zones import DEFAULT_DST, DstFold, DstGap, DstPolicy

# Version 2 added the schedule's "dst" policy (absent: cron(8)'s default). A
# definition is written as version 2 only when it carries one, so a build that
# reads version 1 alone refuses exactly the jobs it would fire by another rule.
DEFINITION_VERSION = 2
_VERSION_BEFORE_DST = 1


class UnreadableDefinition(ValueError):
    """A stored definition this build cannot read (a newer format, or not a definition)."""


def encode_job(job: Job) -> dict[str, Any]:
    """What the job catalog stores for ``job``: its definition and the format's version.

    The version is not part of the fingerprint (``Job.fingerprint``): a job is
    edited when its definition changes, not when the format's number does.
    """
    definition = job.definition()
    version = DEFINITION_VERSION if "dst" in definition["schedule"] else _VERSION_BEFORE_DST
    return {"version": version, **definition}


def decode_job(name: str, data: Mapping[str, Any] | str, enabled: bool = True) -> Job:
    """The job stored as ``data`` (a mapping, or its JSON text), named ``name``."""
    if isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, Mapping):
        raise UnreadableDefinition(
            f"job {name!r}: a stored definition is a JSON object, not {type(data).__name__}"
        )
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UnreadableDefinition(
            f"job {name!r}: definition version {version!r} is not a positive whole number"
        )
    if version > DEFINITION_VERSION:
        raise UnreadableDefinition(
            f"job {name!r}: definition version {version} was written by a newer claimd; "
            f"this one reads up to version {DEFINITION_VERSION}"
        )
    retry = data.get("retry", {})
    deadline = data.get("starting_deadline_ms")
    # The parts many jobs have alike are shared (actors.domain.sharing): a
    # reader holding every job holds one schedule per expression and zone.
    return Job(
        name=name,
        schedule=decode_schedule(data["schedule"]),
        executor=shared(decode_executor(data["executor"])),
        timeout=_millis(data["timeout_ms"]),
        max_attempts=int(data["max_attempts"]),
        enabled=enabled,
        overlap=Overlap(data["overlap"]),
        catchup=Catchup(data["catchup"]),
        catchup_window=_millis(data["catchup_window_ms"]),
        starting_deadline=None if deadline is None else _millis(deadline),
        jitter=_millis(data.get("jitter_ms", _ms(defaults.JITTER))),
        retry=shared(
            RetryPolicy(
                initial=_millis(retry.get("initial_ms", _ms(defaults.RETRY_INITIAL))),
                maximum=_millis(retry.get("maximum_ms", _ms(defaults.RETRY_MAXIMUM))),
                multiplier=float(retry.get("multiplier", defaults.RETRY_MULTIPLIER)),
            )
        ),
    )


def _ms(value: timedelta) -> int:
    """A default duration as the stored definitions write it: whole milliseconds."""
    return int(value.total_seconds() * 1000)


@lru_cache(maxsize=1024)
def _millis(ms: float) -> timedelta:
    """A stored duration; the few distinct ones are shared between jobs (immutable)."""
    return timedelta(milliseconds=ms)


def decode_executor(data: Mapping[str, Any]) -> ExecutorSpec:
    """The executor part of a stored definition (inverse of ``executor_to_dict``)."""
    kind = data.get("kind")
    if kind == "shell":
        return ShellSpec(
            argv=tuple(data["argv"]),
            env=dict(data.get("env") or {}),
            cwd=data.get("cwd"),
            use_shell=bool(data.get("use_shell")),
            secret_env=dict(data.get("secret_env") or {}),
            inherit_env=tuple(data.get("inherit_env") or ()),
        )
    if kind == "python":
        return PythonSpec(target=str(data["target"]))
    if kind == "http":
        return HttpSpec(
            url=str(data["url"]),
            method=str(data.get("method", defaults.HTTP_METHOD)),
            headers=dict(data.get("headers") or {}),
            body=data.get("body"),
            secret_headers=dict(data.get("secret_headers") or {}),
            expect_status=tuple(
                int(s) for s in data.get("expect_status", defaults.HTTP_EXPECT_STATUS)
            ),
        )
    raise ValueError(f"unknown executor kind {kind!r}")


# Schedules are immutable: jobs with the same expression and zone share one
# (10,000 jobs on "* * * * *" parse it once, and hold one object between them).
_SCHEDULES: dict[tuple[str, str, DstPolicy] | int, CronSchedule | IntervalSchedule] = {}
_SCHEDULES_KEPT = 100_000


def decode_dst(data: Mapping[str, Any] | None) -> DstPolicy:
    """A stored ``dst`` policy; absent (every definition before version 2): the default."""
    if not data:
        return DEFAULT_DST
    return shared(
        DstPolicy(
            gap=DstGap(data.get("gap", defaults.DST_GAP)),
            fold=DstFold(data.get("fold", defaults.DST_FOLD)),
        )
    )


def decode_schedule(data: Mapping[str, Any]) -> CronSchedule | IntervalSchedule:
    """The schedule part of a stored definition (shared with every job that has the same)."""
    key: tuple[str, str, DstPolicy] | int
    if "cron" in data:
        key = (
            str(data["cron"]),
            str(data.get("timezone", defaults.TIMEZONE)),
            decode_dst(data.get("dst")),
        )
    else:
        key = int(data["every_us"])
    schedule = _SCHEDULES.get(key)
    if schedule is None:
        if isinstance(key, tuple):
            schedule = shared(CronSchedule(*key))
        else:
            schedule = shared(IntervalSchedule(timedelta(microseconds=key)))
        if len(_SCHEDULES) >= _SCHEDULES_KEPT:
            _SCHEDULES.clear()
        _SCHEDULES[key] = schedule
    return schedule


class DecodedJobs:
    """Stored definitions decoded once per (job, fingerprint): a bounded cache.

    Keyed by the name too: two jobs may have the same definition, and a Job
    carries its name. ``size`` 0: unbounded, for a reader that holds every job
    and says which to keep (``keep``).
    """

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._jobs: OrderedDict[tuple[str, str], Job] = OrderedDict()

    def job(self, name: str, fingerprint: str, definition: Mapping[str, Any] | str) -> Job:
        """The job stored as ``definition``; decoded only the first time it is seen."""
        key = (name, fingerprint)
        job = self._jobs.get(key)
        if job is None:
            job = decode_job(name, definition)
            self._jobs[key] = job
            if self._size and len(self._jobs) > self._size:
                self._jobs.popitem(last=False)
        elif self._size:
            self._jobs.move_to_end(key)
        return job

    def keep(self, keys: set[tuple[str, str]]) -> None:
        """Forget every decoded job but those named by (name, fingerprint) ``keys``."""
        for key in [k for k in self._jobs if k not in keys]:
            del self._jobs[key]

"""Jobs: what runs, when, and under which policies."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from actors.domain import defaults
from actors.domain.attempts import RetryPolicy
from actors.domain.schedule import CronSchedule, IntervalSchedule
from actors.domain.zones import DEFAULT_DST

# catchup = "none" without a starting_deadline: a run that could not start
# within this long after its instant is skipped rather than run late.
NONE_CATCHUP_DEADLINE = timedelta(minutes=1)


class Overlap(enum.StrEnum):
    """What happens when a run is due while an earlier run of the job is active."""

    ALLOW = "allow"
    FORBID = "forbid"
    QUEUE = "queue"


class Catchup(enum.StrEnum):
    """Which instants missed while no scheduler ran are materialized afterwards."""

    ALL = "all"
    LATEST = "latest"
    NONE = "none"


@dataclass(frozen=True)
class ShellSpec:
    """Run a program. ``argv`` runs without a shell unless ``use_shell`` says so."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    use_shell: bool = False
    # Job variable -> name of the variable in claimd's own environment that
    # holds the value. Read by the worker at run time: never stored, never
    # logged, and scrubbed from the output kept on the run.
    secret_env: Mapping[str, str] = field(default_factory=dict)
    # Names of claimd's own variables the job receives as they are. A job's
    # environment is a small base (PATH, HOME, LANG, TZ), the run's CLAIMD_*
    # values, ``env``, ``secret_env`` and these: nothing else of claimd's.
    inherit_env: tuple[str, ...] = ()
    kind: str = "shell"


@dataclass(frozen=True)
class PythonSpec:
    """Call ``module:function`` with a run context; sync or async."""

    target: str
    kind: str = "python"


@dataclass(frozen=True)
class HttpSpec:
    """Send an HTTP request carrying the run's idempotency key."""

    url: str
    method: str = defaults.HTTP_METHOD
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None
    expect_status: tuple[int, ...] = defaults.HTTP_EXPECT_STATUS
    secret_headers: Mapping[str, str] = field(default_factory=dict)  # header -> env var
    kind: str = "http"


ExecutorSpec = ShellSpec | PythonSpec | HttpSpec
DEFAULT_OVERLAP = Overlap(defaults.OVERLAP)
DEFAULT_CATCHUP = Catchup(defaults.CATCHUP)


def executor_to_dict(spec: ExecutorSpec) -> dict[str, Any]:
    """The JSON form stored in ``jobs.definition``; workers execute from it."""
    if isinstance(spec, ShellSpec):
        return {
            "kind": "shell",
            "argv": list(spec.argv),
            "env": dict(spec.env),
            "cwd": spec.cwd,
            "use_shell": spec.use_shell,
            "secret_env": dict(spec.secret_env),
            # Written only when given: the definitions (and fingerprints) of
            # the jobs that inherit nothing stay what they were.
            **({"inherit_env": list(spec.inherit_env)} if spec.inherit_env else {}),
        }
    if isinstance(spec, PythonSpec):
        return {"kind": "python", "target": spec.target}
    return {
        "kind": "http",
        "url": spec.url,
        "method": spec.method,
        "headers": dict(spec.headers),
        "body": spec.body,
        "secret_headers": dict(spec.secret_headers),
        "expect_status": list(spec.expect_status),
    }


# Slots: a replica holds one Job per job (100,000 of them), each a row of
# references to values most jobs share (actors.domain.sharing).
@dataclass(frozen=True, slots=True)
class Job:
    """A job as declared in the config file, validated."""

    name: str
    schedule: CronSchedule | IntervalSchedule
    executor: ExecutorSpec
    # Every default here is actors.domain.defaults' (the config reads the same).
    timeout: timedelta = defaults.TIMEOUT
    max_attempts: int = defaults.MAX_ATTEMPTS
    enabled: bool = defaults.ENABLED
    overlap: Overlap = DEFAULT_OVERLAP
    catchup: Catchup = DEFAULT_CATCHUP
    catchup_window: timedelta = defaults.CATCHUP_WINDOW
    starting_deadline: timedelta | None = None
    jitter: timedelta = defaults.JITTER
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # The fingerprint, once computed (a digest of the definition's JSON: the
    # sync and the materializer each ask for 100,000 of them at start).
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    def start_deadline(self) -> timedelta:
        """How late a first attempt may start before it is skipped instead."""
        if self.starting_deadline is not None:
            return self.starting_deadline
        if self.catchup is Catchup.NONE:
            return min(NONE_CATCHUP_DEADLINE, self.catchup_window)
        return self.catchup_window

    def definition(self) -> dict[str, Any]:
        """Everything a worker and the claimer need (stored through actors.domain.definitions)."""
        schedule: dict[str, Any]
        if isinstance(self.schedule, CronSchedule):
            schedule = {"cron": self.schedule.expression, "timezone": self.schedule.timezone}
            if self.schedule.dst != DEFAULT_DST:
                # Written only when set: the definitions (and fingerprints) of
                # jobs on the default stay what they were before the policy.
                schedule["dst"] = {
                    "gap": self.schedule.dst.gap.value,
                    "fold": self.schedule.dst.fold.value,
                }
        else:
            schedule = {"every_us": int(self.schedule.every.total_seconds() * 1_000_000)}
        return {
            "schedule": schedule,
            "executor": executor_to_dict(self.executor),
            "timeout_ms": int(self.timeout.total_seconds() * 1000),
            "max_attempts": self.max_attempts,
            "overlap": self.overlap.value,
            "catchup": self.catchup.value,
            "catchup_window_ms": int(self.catchup_window.total_seconds() * 1000),
            "starting_deadline_ms": (
                None
                if self.starting_deadline is None
                else int(self.starting_deadline.total_seconds() * 1000)
            ),
            "jitter_ms": int(self.jitter.total_seconds() * 1000),
            "retry": {
                "initial_ms": int(self.retry.initial.total_seconds() * 1000),
                "maximum_ms": int(self.retry.maximum.total_seconds() * 1000),
                "multiplier": self.retry.multiplier,
            },
        }

    def fingerprint(self) -> str:
        """A digest of the definition; a change means the job was edited.

        The sha256 (hex) of the definition's canonical JSON text, not the text
        itself: every replica keeps it per job beside the definition, and the
        materializer fences its writes with it. sql/0010 turned the texts
        stored before into the same digests, so no job looks edited.
        """
        if self._fingerprint is None:
            digest = hashlib.sha256(canonical_definition(self).encode()).hexdigest()
            object.__setattr__(self, "_fingerprint", digest)  # frozen: the cache alone
            return digest
        return self._fingerprint


def canonical_definition(job: Job) -> str:
    """The definition as one canonical JSON text (sorted keys, no spaces): what is digested."""
    return json.dumps(job.definition(), sort_keys=True, separators=(",", ":"))

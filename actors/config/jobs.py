"""The ``[jobs.NAME]`` tables -> domain Jobs, each error naming the file, job and field.

Durations here stay text in the model and are parsed in :func:`job_from_raw`,
after the schedule and executor checks, so that the error a bad job reports
is the one it always reported.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from actors.config.errors import ConfigError, JobErrors, StrictModel, error_fields
from actors.domain import (
    DEFAULT_DST,
    Catchup,
    ClaimdError,
    CronSchedule,
    DstFold,
    DstGap,
    DstPolicy,
    ExecutorSpec,
    HttpSpec,
    IntervalSchedule,
    Job,
    Overlap,
    PythonSpec,
    RetryPolicy,
    ShellSpec,
    defaults,
    format_duration,
    load_zone,
    parse_duration,
    shared,
)
from actors.observability.secrets import looks_like_secret

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

DurationText = Annotated[str, Field(description="a duration with a unit: 500ms, 30s, 15m, 2h")]

# Every default below is the domain's (actors.domain.defaults), written as the
# config file would write it; the durations are parsed in job_from_raw.


class HttpRunModel(StrictModel):
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = defaults.HTTP_METHOD
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    expect_status: list[int] = Field(default_factory=lambda: list(defaults.HTTP_EXPECT_STATUS))
    secret_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


class RunModel(StrictModel):
    shell: list[str] | str | None = None
    use_shell: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, str] = Field(default_factory=dict)
    # Variables of claimd's own environment the job receives as they are; a
    # job gets no other host variable (PATH, HOME, LANG and TZ aside).
    inherit_env: list[str] = Field(default_factory=list)
    cwd: str | None = None
    python: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    http: HttpRunModel | None = None


class BackoffModel(StrictModel):
    initial: DurationText = format_duration(defaults.RETRY_INITIAL)
    max: DurationText = format_duration(defaults.RETRY_MAXIMUM)
    multiplier: float = Field(default=defaults.RETRY_MULTIPLIER, ge=1.0, le=10.0)


class DstModel(StrictModel):
    gap: Literal["shift", "skip"] = defaults.DST_GAP
    fold: Literal["first", "last", "both"] = defaults.DST_FOLD


class JobModel(StrictModel):
    cron: str | None = None
    every: DurationText | None = None
    timezone: str = defaults.TIMEZONE
    timeout: DurationText = format_duration(defaults.TIMEOUT)
    max_attempts: int = Field(default=defaults.MAX_ATTEMPTS, ge=1, le=100)
    enabled: bool = defaults.ENABLED
    overlap: Literal["allow", "forbid", "queue"] = defaults.OVERLAP
    catchup: Literal["all", "latest", "none"] = defaults.CATCHUP
    catchup_window: DurationText = format_duration(defaults.CATCHUP_WINDOW)
    starting_deadline: DurationText | None = None
    jitter: DurationText | None = None
    backoff: BackoffModel = Field(default_factory=BackoffModel)
    dst: DstModel | None = None
    run: RunModel


def _executor_from(run: RunModel) -> ExecutorSpec:
    chosen = [k for k in ("shell", "python", "http") if getattr(run, k) is not None]
    if len(chosen) != 1:
        raise ValueError(
            "give exactly one of shell, python or http"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    if run.shell is not None:
        if isinstance(run.shell, str):
            if not run.use_shell:
                raise ValueError(
                    "a string command needs use_shell = true; "
                    'otherwise give an argv list such as ["/bin/echo", "hi"]'
                )
            argv: tuple[str, ...] = (run.shell,)
        else:
            if not run.shell:
                raise ValueError("shell needs at least the program to run")
            argv = tuple(run.shell)
        for position, (name, source) in enumerate(run.secret_env.items(), 1):
            _check_variable_names("secret_env", position, name, source)
        for position, name in enumerate(run.inherit_env, 1):
            _check_variable_names("inherit_env", position, name)
        return ShellSpec(
            argv=argv,
            env=dict(run.env),
            cwd=run.cwd,
            use_shell=run.use_shell,
            secret_env=dict(run.secret_env),
            inherit_env=tuple(dict.fromkeys(run.inherit_env)),
        )
    if run.use_shell or run.env or run.cwd or run.secret_env or run.inherit_env:
        raise ValueError("use_shell, env, secret_env, inherit_env and cwd apply only to shell jobs")
    if run.python is not None:
        return PythonSpec(target=run.python)
    assert run.http is not None
    for position, source in enumerate(run.http.secret_headers.values(), 1):
        _check_variable_names("secret_headers", position, source)
    return HttpSpec(
        url=run.http.url,
        method=run.http.method,
        headers=dict(run.http.headers),
        body=run.http.body,
        expect_status=tuple(run.http.expect_status),
        secret_headers=dict(run.http.secret_headers),
    )


def _check_variable_names(key: str, position: int, *names: str) -> None:
    """Each of ``names`` is a variable name; the error quotes none of them.

    A name that is not one is often the value itself pasted where its
    variable's name belongs (``secret_env = { TOKEN = "sk_live_..." }``): the
    error names the entry's position and never repeats what was written.
    """
    for name in names:
        if looks_like_secret(name):
            raise ValueError(
                f"{key}: entry {position} holds a value that looks like a secret where a "
                "variable name belongs; give the NAME of the environment variable that "
                "holds it (the value is not repeated here)"
            )
        if not re.fullmatch(ENV_NAME, name):
            raise ValueError(
                f"{key}: entry {position} is not a variable name (letters, digits and '_', "
                "not starting with a digit; what was written is not repeated here)"
            )


def _schedule_from(path: str, name: str, model: JobModel) -> CronSchedule | IntervalSchedule:
    if (model.cron is None) == (model.every is None):
        raise ConfigError(
            path,
            "give exactly one of cron or every",
            job=name,
            field_name="cron" if model.cron is not None else "every",
        )
    try:
        # Shared: the jobs on one expression and zone hold one schedule (and one
        # parsed expression) between them.
        if model.cron is not None:
            schedule: CronSchedule | IntervalSchedule = shared(
                CronSchedule(model.cron, model.timezone, _dst_from(model))
            )
        else:
            if model.timezone != defaults.TIMEZONE:
                load_zone(model.timezone)  # validates the zone
            assert model.every is not None
            schedule = shared(IntervalSchedule(parse_duration(model.every)))
    except ClaimdError as exc:
        bad = "timezone" if "time zone" in str(exc) else ("cron" if model.cron else "every")
        raise ConfigError(path, str(exc), job=name, field_name=bad) from None
    if model.dst is not None and not (isinstance(schedule, CronSchedule) and schedule.fixed_time):
        raise ConfigError(
            path,
            "dst applies to cron schedules, not to every"
            if model.cron is None
            else f"dst applies to a fixed-time schedule (minute and hour both fixed); "
            f"cron {model.cron!r} has a wildcard minute or hour, which runs at every "
            "real instant that matches (cron(8)); remove dst",
            job=name,
            field_name="dst",
        )
    return schedule


def _dst_from(model: JobModel) -> DstPolicy:
    if model.dst is None:
        return DEFAULT_DST
    return shared(DstPolicy(DstGap(model.dst.gap), DstFold(model.dst.fold)))


def job_from_raw(path: str, name: str, raw: Any) -> Job:
    """One job table -> a domain Job, or ConfigError naming the job and field."""
    if not re.fullmatch(JOB_NAME_PATTERN, name):
        raise ConfigError(path, "a job name is 1-100 letters, digits, '_', '.', '-'", job=name)
    if not isinstance(raw, dict):
        raise ConfigError(path, "a job must be a table ([jobs.NAME])", job=name)
    try:
        model = JobModel.model_validate(raw)
    except ValidationError as exc:
        # Every field pydantic refused, not the first alone: one round of fixes.
        raise JobErrors(
            [ConfigError(path, msg, job=name, field_name=loc) for loc, msg in error_fields(exc)]
        ) from None

    problems: list[ConfigError] = []

    def fail(field_name: str, exc: Exception) -> None:
        problems.append(ConfigError(path, str(exc), job=name, field_name=field_name))

    try:
        schedule = _schedule_from(path, name, model)
    except ConfigError as exc:
        problems.append(exc)
    try:
        executor = shared(_executor_from(model.run))
    except ValueError as exc:
        fail("run", exc)
    values: dict[str, timedelta | None] = {}
    for key in ("timeout", "catchup_window", "starting_deadline", "jitter"):
        text = getattr(model, key)
        try:
            # jitter = "0s" reads as "no jitter"; every other duration must be positive.
            values[key] = None if text is None else parse_duration(text, allow_zero=key == "jitter")
        except ClaimdError as exc:
            fail(key, exc)
    backoff: dict[str, timedelta] = {}
    for key in ("initial", "max"):
        try:
            backoff[key] = parse_duration(getattr(model.backoff, key))
        except ClaimdError as exc:
            fail(f"backoff.{key}", exc)
    if problems:
        raise JobErrors(problems)
    retry = shared(
        RetryPolicy(
            initial=backoff["initial"], maximum=backoff["max"], multiplier=model.backoff.multiplier
        )
    )
    timeout = values["timeout"]
    catchup_window = values["catchup_window"]
    assert timeout is not None
    assert catchup_window is not None
    return Job(
        name=name,
        schedule=schedule,
        executor=executor,
        timeout=timeout,
        max_attempts=model.max_attempts,
        enabled=model.enabled,
        overlap=Overlap(model.overlap),
        catchup=Catchup(model.catchup),
        catchup_window=catchup_window,
        starting_deadline=values["starting_deadline"],
        jitter=values["jitter"] or defaults.JITTER,
        retry=retry,
    )


class JobReader:
    """:func:`job_from_raw` for the jobs of one file, each distinct table validated once.

    A config of 100,000 jobs has far fewer distinct tables: thousands of jobs
    on one expression, with one executor, differ by their name alone. A table
    equal to one already read gives that job again under its own name; the
    validation, with its errors naming the job and field, runs for the first
    of them (and for every table that fails).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._read: dict[str, Job] = {}

    def job(self, name: str, raw: Any) -> Job:
        if not re.fullmatch(JOB_NAME_PATTERN, name):
            return job_from_raw(self.path, name, raw)  # the name's error
        # The table's repr is the key: a TOML table holds only str, int, float,
        # bool, dates and times, arrays and tables, whose reprs differ whenever
        # their values or types do (1, 1.0 and True are equal in Python, not to
        # the strict validation). Equal tables with their keys in another order
        # are merely validated again.
        key = repr(raw)
        same = self._read.get(key)
        if same is not None:
            return dataclasses.replace(same, name=name)
        job = job_from_raw(self.path, name, raw)
        self._read[key] = job
        return job

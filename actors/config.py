"""The config file: TOML settings and job definitions -> domain objects, with clear errors.

Every error names the file, the job (where there is one) and the field. A bad
job never hides the good ones: :func:`load_config` returns the valid jobs and
one error per invalid job; the caller decides (start-up runs the valid ones,
reload refuses the whole file).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from actors.domain import (
    Catchup,
    ClaimdError,
    CronSchedule,
    ExecutorSpec,
    HttpSpec,
    IntervalSchedule,
    Job,
    LeaseSettings,
    Overlap,
    PythonSpec,
    RetryPolicy,
    ShellSpec,
    TimeoutBudget,
    check_timeout_budget,
    parse_duration,
)
from actors.observability import redact

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class ConfigError(ClaimdError):
    """One problem in a config file, located by file, job and field."""

    def __init__(self, path: str, message: str, *, job: str | None = None,
                 field_name: str | None = None) -> None:
        self.path = path
        self.job = job
        self.field_name = field_name
        self.message = message
        where = path
        if job is not None:
            where += f": job {job!r}"
        if field_name is not None:
            where += f": field {field_name!r}"
        super().__init__(f"{where}: {message}")


class ConfigErrors(ClaimdError):
    """Several problems at once; ``str()`` lists each on its own line."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _duration(value: Any, *, allow_zero: bool = False) -> timedelta:
    return parse_duration(value, allow_zero=allow_zero)


Duration = Annotated[str, Field(description="a duration with a unit: 500ms, 30s, 15m, 2h")]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must never be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SettingsModel(_Strict):
    database_url: str = "postgresql://localhost/claimd"
    # One server, or several of one cluster: a list, or one string separated by commas.
    nats_url: str | list[str] = "nats://127.0.0.1:4222"
    nats_tls_ca: str | None = None
    deployment: str = Field(default="claimd", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    lease: Duration = "120s"
    ack_wait: Duration = "5s"
    max_deliver: int = Field(default=5, ge=1, le=100)
    http: str = "127.0.0.1:8780"
    claim_batch: int = Field(default=500, ge=1, le=10_000)
    max_claimed: int = Field(default=5_000, ge=1, le=1_000_000)
    worker_concurrency: int = Field(default=64, ge=1, le=10_000)
    claim_interval: Duration = "200ms"
    materialize_interval: Duration = "1s"
    reap_interval: Duration = "1s"
    horizon: Duration = "2m"
    shutdown_grace: Duration = "30s"
    duplicate_window: Duration = "2m"
    history_retention: Duration = "30d"
    # Bearer tokens for the API's actions: a file of lines "NAME TOKEN" (or one
    # bare token), and/or the name of an environment variable holding one.
    # Without either the API is read-only.
    api_token_file: str | None = None
    api_token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # The stream's copies in a JetStream cluster: 1 for one server, 3 for a cluster.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # Derived from the lease when not given (see actors.domain.lease.TimeoutBudget).
    statement_timeout: Duration | None = None
    publish_timeout: Duration | None = None

    @field_validator("nats_url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        if not isinstance(value, str | list):
            raise ValueError("expected a server URL, a list of them, or URLs separated by commas")
        return value

    @field_validator("lease", "ack_wait", "claim_interval", "materialize_interval",
                     "reap_interval", "horizon", "shutdown_grace", "duplicate_window",
                     "history_retention", "statement_timeout", "publish_timeout")
    @classmethod
    def _is_duration(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            _duration(value)
        except ClaimdError as exc:
            # pydantic reports only ValueError as a field error; anything else
            # would escape without the file and field.
            raise ValueError(str(exc)) from None
        return value


class HttpRunModel(_Strict):
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: str | None = None
    expect_status: list[int] = Field(default_factory=lambda: [200, 201, 202, 204])
    secret_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class RunModel(_Strict):
    shell: list[str] | str | None = None
    use_shell: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    python: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    http: HttpRunModel | None = None


class BackoffModel(_Strict):
    initial: Duration = "1s"
    max: Duration = "5m"
    multiplier: float = Field(default=2.0, ge=1.0, le=10.0)


class JobModel(_Strict):
    cron: str | None = None
    every: Duration | None = None
    timezone: str = "UTC"
    timeout: Duration = "1h"
    max_attempts: int = Field(default=3, ge=1, le=100)
    enabled: bool = True
    overlap: Literal["allow", "forbid", "queue"] = "allow"
    catchup: Literal["all", "latest", "none"] = "all"
    catchup_window: Duration = "1h"
    starting_deadline: Duration | None = None
    jitter: Duration | None = None
    backoff: BackoffModel = Field(default_factory=BackoffModel)
    run: RunModel


@dataclass(frozen=True)
class Settings:
    """Validated process settings."""

    database_url: str
    nats_url: str
    nats_tls_ca: str | None
    deployment: str
    lease: timedelta
    ack_wait: timedelta
    max_deliver: int
    http_host: str
    http_port: int
    claim_batch: int
    max_claimed: int
    worker_concurrency: int
    claim_interval: timedelta
    materialize_interval: timedelta
    reap_interval: timedelta
    horizon: timedelta
    shutdown_grace: timedelta
    duplicate_window: timedelta
    history_retention: timedelta
    api_token_file: str | None = None
    api_token_env: str | None = None
    # (name, token) pairs; the name is who the API records as the actor.
    api_tokens: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    stream_replicas: int = 1
    statement_timeout: timedelta | None = None
    publish_timeout: timedelta | None = None

    @property
    def lease_settings(self) -> LeaseSettings:
        return LeaseSettings(lease=self.lease, ack_wait=self.ack_wait,
                             max_deliver=self.max_deliver)

    @property
    def timeouts(self) -> TimeoutBudget:
        """Every database and broker deadline, derived from the lease."""
        return TimeoutBudget.from_settings(self.lease, self.ack_wait, self.max_deliver,
                                           statement_timeout=self.statement_timeout,
                                           publish_timeout=self.publish_timeout)

    @property
    def nats_servers(self) -> list[str]:
        """The NATS server URLs (``nats_url`` keeps them comma-separated)."""
        return self.nats_url.split(",")

    @property
    def stream(self) -> str:
        return f"CLAIMD_{self.deployment}"

    @property
    def subject(self) -> str:
        return f"claimd.{self.deployment}.runs"


@dataclass(frozen=True)
class LoadedConfig:
    """What a config file yields: settings, the valid jobs, and one error per bad job."""

    path: str
    settings: Settings
    jobs: dict[str, Job]
    errors: list[ConfigError] = field(default_factory=list)

    def raise_for_errors(self) -> None:
        if self.errors:
            raise ConfigErrors(self.errors)


def _first_error_field(exc: ValidationError) -> tuple[str | None, str]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or None
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (a typo?); remove it or check the spelling"
    elif err["type"] == "value_error" and "error" in err.get("ctx", {}):
        msg = str(err["ctx"]["error"])  # our own words, without "Value error, "
    return loc, msg


_NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def _nats_servers(path: str, value: str | list[str], source: str) -> str:
    """Several NATS URLs (a list or comma-separated) -> one comma-separated string."""
    urls = [u.strip() for u in (value.split(",") if isinstance(value, str) else value)]
    if not urls or not all(urls):
        raise ConfigError(path, f"{source}give one or more server URLs "
                          "(a list, or separated by commas), none empty",
                          field_name="claimd.nats_url")
    for url in urls:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in _NATS_SCHEMES or not rest.rpartition("@")[2]:
            raise ConfigError(path, f"{source}{redact(url)!r} is not a NATS server URL "
                              "(nats://host:port, tls://host:port)",
                              field_name="claimd.nats_url")
    return ",".join(urls)


def _settings_from(path: str, raw: dict[str, Any], env: dict[str, str]) -> Settings:
    try:
        model = SettingsModel.model_validate(raw)
    except ValidationError as exc:
        loc, msg = _first_error_field(exc)
        raise ConfigError(path, msg, field_name=f"claimd.{loc}" if loc else "claimd") from None
    http = env.get("CLAIMD_HTTP") or model.http
    host, _, port = http.rpartition(":")
    if http == "off":
        host, port = "", "-1"
    elif not host or not port.isdigit():
        raise ConfigError(path, f"expected host:port or \"off\", got {http!r}",
                          field_name="claimd.http")
    nats_env = env.get("CLAIMD_NATS_URL")
    nats_url = (_nats_servers(path, nats_env, "from CLAIMD_NATS_URL: ") if nats_env
                else _nats_servers(path, model.nats_url, ""))
    settings = Settings(
        database_url=env.get("CLAIMD_DATABASE_URL") or model.database_url,
        nats_url=nats_url,
        nats_tls_ca=env.get("CLAIMD_NATS_TLS_CA") or model.nats_tls_ca,
        deployment=model.deployment,
        lease=_duration(model.lease),
        ack_wait=_duration(model.ack_wait),
        max_deliver=model.max_deliver,
        http_host=host,
        http_port=int(port),  # 0 picks a free port; -1 ("off") serves nothing
        claim_batch=model.claim_batch,
        max_claimed=model.max_claimed,
        worker_concurrency=model.worker_concurrency,
        claim_interval=_duration(model.claim_interval),
        materialize_interval=_duration(model.materialize_interval),
        reap_interval=_duration(model.reap_interval),
        horizon=_duration(model.horizon),
        shutdown_grace=_duration(model.shutdown_grace),
        duplicate_window=_duration(model.duplicate_window),
        history_retention=_duration(model.history_retention),
        api_token_file=model.api_token_file,
        api_token_env=model.api_token_env,
        api_tokens=_api_tokens(path, model, env),
        stream_replicas=model.stream_replicas,
        statement_timeout=(None if model.statement_timeout is None
                           else _duration(model.statement_timeout)),
        publish_timeout=(None if model.publish_timeout is None
                         else _duration(model.publish_timeout)),
    )
    try:
        # The redelivery rule, then every deadline of the budget inside the lease.
        check_timeout_budget(settings.timeouts)
    except ClaimdError as exc:
        raise ConfigError(path, str(exc), field_name="claimd.lease") from None
    return settings


MIN_TOKEN_LENGTH = 16


def _api_tokens(path: str, model: SettingsModel, env: dict[str, str]
                ) -> tuple[tuple[str, str], ...]:
    """The API tokens the settings name, read now so that a bad one stops the load."""
    tokens: list[tuple[str, str]] = []

    def add(name: str, token: str, field_name: str) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            # The message names the token's name, never the token.
            raise ConfigError(path, f"the API token named {name!r} is shorter than "
                              f"{MIN_TOKEN_LENGTH} characters (make one with "
                              "`openssl rand -hex 32`)", field_name=field_name)
        tokens.append((name, token))

    if model.api_token_file:
        field_name = "claimd.api_token_file"
        try:
            text = Path(model.api_token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(path, f"cannot read {model.api_token_file}: {reason}",
                              field_name=field_name) from None
        lines = [line.split() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        for number, parts in enumerate(lines, 1):
            if len(parts) == 1 and len(lines) == 1:
                parts = ["api", parts[0]]
            if len(parts) != 2:
                raise ConfigError(path, f"{model.api_token_file} line {number}: expected "
                                  "NAME TOKEN (or a file holding one bare token)",
                                  field_name=field_name)
            add(parts[0], parts[1], field_name)
    if model.api_token_env:
        value = env.get(model.api_token_env, "").strip()
        if not value:
            raise ConfigError(path, f"the environment variable {model.api_token_env} is not "
                              "set or empty", field_name="claimd.api_token_env")
        add("api", value, "claimd.api_token_env")
    return tuple(tokens)


def _executor_from(run: RunModel) -> ExecutorSpec:
    chosen = [k for k in ("shell", "python", "http") if getattr(run, k) is not None]
    if len(chosen) != 1:
        raise ValueError("give exactly one of shell, python or http"
                         + (f" (got {', '.join(chosen)})" if chosen else ""))
    if run.shell is not None:
        if isinstance(run.shell, str):
            if not run.use_shell:
                raise ValueError("a string command needs use_shell = true; "
                                 "otherwise give an argv list such as [\"/bin/echo\", \"hi\"]")
            argv: tuple[str, ...] = (run.shell,)
        else:
            if not run.shell:
                raise ValueError("shell needs at least the program to run")
            argv = tuple(run.shell)
        for name, source in run.secret_env.items():
            if not re.match(ENV_NAME, name) or not re.match(ENV_NAME, source):
                raise ValueError(f"secret_env maps variable names to variable names; "
                                 f"{name!r} = {source!r} is not one")
        return ShellSpec(argv=argv, env=dict(run.env), cwd=run.cwd, use_shell=run.use_shell,
                         secret_env=dict(run.secret_env))
    if run.use_shell or run.env or run.cwd or run.secret_env:
        raise ValueError("use_shell, env, secret_env and cwd apply only to shell jobs")
    if run.python is not None:
        return PythonSpec(target=run.python)
    assert run.http is not None
    for header, source in run.http.secret_headers.items():
        if not re.match(ENV_NAME, source):
            raise ValueError(f"secret_headers maps a header to an environment variable "
                             f"name; {header!r} = {source!r} is not one")
    return HttpSpec(url=run.http.url, method=run.http.method, headers=dict(run.http.headers),
                    body=run.http.body, expect_status=tuple(run.http.expect_status),
                    secret_headers=dict(run.http.secret_headers))


def _schedule_from(path: str, name: str, model: JobModel) -> CronSchedule | IntervalSchedule:
    if (model.cron is None) == (model.every is None):
        raise ConfigError(path, "give exactly one of cron or every", job=name,
                          field_name="cron" if model.cron is not None else "every")
    try:
        if model.cron is not None:
            return CronSchedule(model.cron, model.timezone)
        if model.timezone != "UTC":
            CronSchedule("* * * * *", model.timezone)  # validates the zone
        assert model.every is not None
        return IntervalSchedule(_duration(model.every))
    except ClaimdError as exc:
        bad = "timezone" if "time zone" in str(exc) else ("cron" if model.cron else "every")
        raise ConfigError(path, str(exc), job=name, field_name=bad) from None


def job_from_raw(path: str, name: str, raw: Any) -> Job:
    """One job table -> a domain Job, or ConfigError naming the job and field."""
    if not re.match(JOB_NAME_PATTERN, name):
        raise ConfigError(path, "a job name is 1-100 letters, digits, '_', '.', '-'", job=name)
    if not isinstance(raw, dict):
        raise ConfigError(path, "a job must be a table ([jobs.NAME])", job=name)
    try:
        model = JobModel.model_validate(raw)
    except ValidationError as exc:
        loc, msg = _first_error_field(exc)
        raise ConfigError(path, msg, job=name, field_name=loc) from None

    def fail(field_name: str, exc: Exception) -> ConfigError:
        return ConfigError(path, str(exc), job=name, field_name=field_name)

    schedule = _schedule_from(path, name, model)
    try:
        executor = _executor_from(model.run)
    except ValueError as exc:
        raise fail("run", exc) from None
    values: dict[str, timedelta | None] = {}
    for key in ("timeout", "catchup_window", "starting_deadline", "jitter"):
        text = getattr(model, key)
        try:
            # jitter = "0s" reads as "no jitter"; every other duration must be positive.
            values[key] = None if text is None else _duration(text,
                                                              allow_zero=key == "jitter")
        except ClaimdError as exc:
            raise fail(key, exc) from None
    backoff: dict[str, timedelta] = {}
    for key in ("initial", "max"):
        try:
            backoff[key] = _duration(getattr(model.backoff, key))
        except ClaimdError as exc:
            raise fail(f"backoff.{key}", exc) from None
    retry = RetryPolicy(initial=backoff["initial"], maximum=backoff["max"],
                        multiplier=model.backoff.multiplier)
    timeout = values["timeout"]
    catchup_window = values["catchup_window"]
    assert timeout is not None
    assert catchup_window is not None
    return Job(
        name=name, schedule=schedule, executor=executor, timeout=timeout,
        max_attempts=model.max_attempts, enabled=model.enabled,
        overlap=Overlap(model.overlap), catchup=Catchup(model.catchup),
        catchup_window=catchup_window, starting_deadline=values["starting_deadline"],
        jitter=values["jitter"] or timedelta(0), retry=retry,
    )


def parse_config(text: str, path: str = "<string>",
                 env: dict[str, str] | None = None) -> LoadedConfig:
    """Parse config text. Settings errors raise; job errors are collected per job."""
    env = dict(os.environ) if env is None else env
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"not valid TOML: {exc}") from None
    unknown = set(raw) - {"claimd", "jobs"}
    if unknown:
        raise ConfigError(path, "unknown top-level table (expected [claimd] and [jobs.NAME])",
                          field_name=sorted(unknown)[0])
    settings_raw = raw.get("claimd", {})
    if not isinstance(settings_raw, dict):
        raise ConfigError(path, "must be a table", field_name="claimd")
    settings = _settings_from(path, settings_raw, env)
    jobs_raw = raw.get("jobs", {})
    if not isinstance(jobs_raw, dict):
        raise ConfigError(path, "must be a table of jobs", field_name="jobs")
    jobs: dict[str, Job] = {}
    errors: list[ConfigError] = []
    for name, job_raw in jobs_raw.items():
        try:
            jobs[name] = job_from_raw(path, name, job_raw)
        except ConfigError as exc:
            errors.append(exc)
    return LoadedConfig(path=path, settings=settings, jobs=jobs, errors=errors)


def load_config(path: str | Path, env: dict[str, str] | None = None) -> LoadedConfig:
    """Read and parse a config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(p), "not UTF-8 text") from None
    return parse_config(text, str(p), env)

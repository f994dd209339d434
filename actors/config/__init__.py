"""The config file: TOML settings and job definitions -> domain objects, with clear errors.

Every error names the file, the job (where there is one) and the field. A bad
job never hides the good ones: :func:`load_config` returns the valid jobs and
one error per invalid job; the caller decides (start-up runs the valid ones,
reload refuses the whole file).

Rooms: ``settings`` (the ``[claimd]`` table), ``jobs`` (the ``[jobs.NAME]``
tables), ``declared`` (the jobs of ``@claimd.job`` in the ``modules`` named,
and the import check of python targets), ``errors`` (ConfigError and pydantic's
errors in our words); this module reads the file and puts them together.
"""

from __future__ import annotations

import contextlib
import gc
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.config.declared import (
    IN_PROCESS,
    CodeImport,
    add_python_jobs,
    find_code,
    python_targets,
)
from actors.config.errors import ConfigError, ConfigErrors
from actors.config.jobs import JOB_NAME_PATTERN, JobReader, job_from_raw
from actors.config.notify import (
    EMPTY,
    NotifyConfig,
    job_notify,
    notify_from_table,
    take_job_keys,
    with_too_long,
)
from actors.config.settings import ENV_OVERRIDES, Duration, Settings
from actors.domain import HttpSpec, Job, ShellSpec
from actors.observability.secrets import MASKER, url_secrets

__all__ = [
    "ENV_OVERRIDES",
    "JOB_NAME_PATTERN",
    "CodeImport",
    "ConfigError",
    "ConfigErrors",
    "Duration",
    "LoadedConfig",
    "Settings",
    "database_url_of",
    "job_from_raw",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True)
class LoadedConfig:
    """What a config file yields: settings, the valid jobs, and one error per bad job."""

    path: str
    settings: Settings
    jobs: dict[str, Job]
    errors: list[ConfigError] = field(default_factory=list)
    # The [notify] table and the jobs' notification keys (docs/notifications.md).
    notify: NotifyConfig = EMPTY

    def raise_for_errors(self) -> None:
        if self.errors:
            raise ConfigErrors(self.errors)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a config is read.

    Reading 100,000 jobs creates millions of containers (TOML's tables, the
    models, the Jobs) and no garbage cycle worth finding: the collections their
    allocations trigger, each walking a heap that keeps growing, were a quarter
    of the load. What a cycle leaves is collected once the collector is back.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_config(
    text: str,
    path: str = "<string>",
    env: dict[str, str] | None = None,
    *,
    read_tokens: bool = True,
    code: CodeImport | None = None,
    folder: str | None = None,
) -> LoadedConfig:
    """Parse config text. Settings errors raise; job errors are collected per job.

    The python code the config names (its ``modules``, its jobs' targets) is
    imported as ``code`` says, with ``folder`` (the file's) first on sys.path;
    without ``code``, not at all (the text alone: no declared jobs, no check
    that a target imports). :func:`load_config` imports it.
    """
    with _collector_paused():
        loaded = _parse_config(text, path, env, read_tokens)
    if code is None:
        return loaded
    modules = loaded.settings.modules
    targets = python_targets(loaded.jobs)
    if modules or targets:
        found = find_code(folder, modules, targets, code)
        # Every job table of the file, valid or not (each error of a table names its job).
        file_names = set(loaded.jobs) | {e.job for e in loaded.errors if e.job is not None}
        add_python_jobs(path, modules, file_names, loaded.jobs, loaded.errors, found)
    return loaded


def _toml(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, f"not valid TOML: {exc}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: thousands
        # of "[" exhaust the interpreter's stack. One line, as for any bad TOML.
        raise ConfigError(
            path, "not valid TOML: arrays or tables nested too deeply to read"
        ) from None


def _parse_config(
    text: str, path: str, env: dict[str, str] | None, read_tokens: bool
) -> LoadedConfig:
    env = dict(os.environ) if env is None else env
    raw = _toml(text, path)
    unknown = set(raw) - {"claimd", "jobs", "notify"}
    if unknown:
        raise ConfigError(
            path,
            "unknown top-level table (expected [claimd] and [jobs.NAME])",
            field_name=sorted(unknown)[0],
        )
    settings_raw = raw.get("claimd", {})
    if not isinstance(settings_raw, dict):
        raise ConfigError(path, "must be a table", field_name="claimd")
    settings = Settings.from_table(path, settings_raw, env, read_tokens=read_tokens)
    MASKER.add(_settings_secrets(settings))
    jobs_raw = raw.get("jobs", {})
    if not isinstance(jobs_raw, dict):
        raise ConfigError(path, "must be a table of jobs", field_name="jobs")
    notify = notify_from_table(path, raw["notify"]) if "notify" in raw else NotifyConfig()
    jobs: dict[str, Job] = {}
    errors: list[ConfigError] = []
    reader = JobReader(path)
    # Each table is let go once read: the jobs take the place of the TOML's
    # tables rather than joining them (a lower peak at 100,000 jobs).
    for name in list(jobs_raw):
        job_raw = jobs_raw.pop(name)
        keys = take_job_keys(job_raw)
        try:
            job = reader.job(name, job_raw)
            if keys:
                notify.jobs[name] = job_notify(path, name, keys, notify.sinks)
            jobs[name] = job
        except ConfigError as exc:
            errors.extend(exc.each())
    notify = with_too_long(notify)
    MASKER.add(env[source] for source in notify.secret_sources() if env.get(source))
    MASKER.add(_job_secrets(jobs.values(), env))
    # The jobs' secrets are known only now: the errors are masked again with them.
    errors = [e.masked() for e in errors]
    return LoadedConfig(path=path, settings=settings, jobs=jobs, errors=errors, notify=notify)


def _settings_secrets(settings: Settings) -> list[str]:
    """The credentials of the settings: API tokens, the database and NATS passwords."""
    return [
        *(entry[1] for entry in settings.api_tokens),
        *url_secrets(settings.database_url),
        *url_secrets(settings.nats_url),
    ]


def _job_secrets(jobs: Any, env: dict[str, str]) -> Iterator[str]:
    """The values of every job's ``secret_env`` and ``secret_headers``, as set now."""
    sources: set[str] = set()
    for job in jobs:
        spec = job.executor
        if isinstance(spec, ShellSpec):
            sources.update(spec.secret_env.values())
        elif isinstance(spec, HttpSpec):
            sources.update(spec.secret_headers.values())
    for source in sources:
        value = env.get(source)
        if value:
            yield value


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(p), "not UTF-8 text") from None


def load_config(
    path: str | Path,
    env: dict[str, str] | None = None,
    *,
    read_tokens: bool = True,
    code: CodeImport = IN_PROCESS,
) -> LoadedConfig:
    """Read and parse a config file (``read_tokens``: see Settings.from_table).

    Its python code is imported as ``code`` says, the file's folder first on sys.path.
    """
    p = Path(path)
    folder = str(p.resolve().parent)
    return parse_config(_read(p), str(p), env, read_tokens=read_tokens, code=code, folder=folder)


def database_url_of(path: str | Path, env: dict[str, str] | None = None) -> str:
    """The one setting an operator command needs from a config file: ``database_url``.

    With its environment override (CLAIMD_DATABASE_URL), else the file's, else
    the default. Nothing else of the file is read: its jobs, its other settings
    and the API token it names (an environment variable the replica has, not
    the operator's shell) are no concern of a command that only reads the
    database.
    """
    env = dict(os.environ) if env is None else env
    if env.get(ENV_OVERRIDES["database_url"]):
        return env[ENV_OVERRIDES["database_url"]]
    p = Path(path)
    table = _toml(_read(p), str(p)).get("claimd", {})
    if not isinstance(table, dict):
        raise ConfigError(str(p), "must be a table", field_name="claimd")
    url = table.get("database_url", Settings.model_fields["database_url"].default)
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(str(p), "expected a PostgreSQL URL", field_name="claimd.database_url")
    return url

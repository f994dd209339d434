"""The ``[notify]`` table (sinks and delivery) and each job's notification keys.

```toml
[notify]
default = ["ops"]             # the sinks of a job that names none ([] or absent: none)

[notify.ops]
kind = "webhook"              # or "slack", "smtp"
url = "https://hooks.example/claimd"
secret_env = "OPS_HOOK_SECRET"

[jobs.nightly]
notify = ["ops"]              # this job's sinks; [] turns the default off
notify_on = ["failed", "recovered", "missed", "too_long"]
failure_tolerance = 3         # failed only from the 3rd failed run in a row
realert = "6h"                # failed again while the job keeps failing, at most this often
deadline = "2h"               # missed: no success within this after the instant
too_long = "30m"              # too_long: still running this long after its start
```

Every error names the file, the sink or job, and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from actors.config.errors import ConfigError
from actors.domain import ClaimdError, parse_duration
from actors.domain.notify import (
    ALL_EVENTS,
    DEFAULT_EVENTS,
    NotifyEvent,
    NotifyPolicy,
    Sink,
    SlackSink,
    SmtpSink,
    WebhookSink,
)
from actors.observability.secrets import looks_like_secret

# The keys of a job table that belong to notifications (taken out before the
# job's own validation: they are not part of its stored definition).
JOB_KEYS = ("notify", "notify_on", "failure_tolerance", "realert", "deadline", "too_long")
SINK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_DEADLINE = timedelta(hours=1)


@dataclass(frozen=True)
class NotifyDelivery:
    """How the outbox is sent: the sender's lease, each send's timeout, retries."""

    lease: timedelta = timedelta(seconds=60)
    timeout: timedelta = timedelta(seconds=10)
    max_attempts: int = 10
    backoff: timedelta = timedelta(seconds=5)
    backoff_max: timedelta = timedelta(minutes=10)
    interval: timedelta = timedelta(seconds=1)
    # missed looks back this far past a deadline (a cluster down longer forgets).
    lookback: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class JobNotify:
    """A job's own notification keys, as written (None: the default)."""

    sinks: tuple[str, ...] | None = None
    events: tuple[NotifyEvent, ...] | None = None
    failure_tolerance: int = 1
    realert: timedelta | None = None
    deadline: timedelta | None = None
    too_long: timedelta | None = None


@dataclass(frozen=True)
class NotifyConfig:
    """The sinks, the defaults, the delivery, and every job's own keys."""

    sinks: dict[str, Sink] = field(default_factory=dict)
    default_sinks: tuple[str, ...] = ()
    default_events: tuple[NotifyEvent, ...] = DEFAULT_EVENTS
    default_deadline: timedelta = DEFAULT_DEADLINE
    delivery: NotifyDelivery = field(default_factory=NotifyDelivery)
    jobs: dict[str, JobNotify] = field(default_factory=dict)

    def policies(self, job_names: Iterable[str]) -> list[NotifyPolicy]:
        """The policy of each job that notifies anyone."""
        out = []
        for name in job_names:
            own = self.jobs.get(name, JobNotify())
            sinks = self.default_sinks if own.sinks is None else own.sinks
            if not sinks:
                continue
            events = self.default_events if own.events is None else own.events
            out.append(
                NotifyPolicy(
                    job=name,
                    sinks=sinks,
                    events=events,
                    failure_tolerance=own.failure_tolerance,
                    realert=own.realert,
                    deadline=own.deadline or self.default_deadline,
                    too_long=own.too_long,
                )
            )
        return out

    def secret_sources(self) -> list[str]:
        """The environment variables holding the sinks' secrets (for the masker)."""
        names = []
        for sink in self.sinks.values():
            if isinstance(sink, WebhookSink) and sink.secret_env:
                names.append(sink.secret_env)
            elif isinstance(sink, SlackSink) and sink.url_env:
                names.append(sink.url_env)
            elif isinstance(sink, SmtpSink) and sink.password_env:
                names.append(sink.password_env)
        return names


EMPTY = NotifyConfig()
_DELIVERY_DURATIONS = ("lease", "timeout", "backoff", "backoff_max", "interval", "lookback")
_TOP_KEYS = {"default", "events", "deadline", "max_attempts", *_DELIVERY_DURATIONS}


def _duration(path: str, text: Any, field_name: str, job: str | None = None) -> timedelta:
    try:
        return parse_duration(text)
    except ClaimdError as exc:
        raise ConfigError(path, str(exc), job=job, field_name=field_name) from None


def _names(path: str, value: Any, field_name: str, job: str | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, "expected a list of sink names", job=job, field_name=field_name)
    return tuple(dict.fromkeys(value))


def _events(
    path: str, value: Any, field_name: str, job: str | None = None
) -> tuple[NotifyEvent, ...]:
    known = ", ".join(e.value for e in ALL_EVENTS)
    if not isinstance(value, list) or not value:
        raise ConfigError(
            path, f"expected a list of events ({known})", job=job, field_name=field_name
        )
    events = []
    for item in value:
        if item not in {e.value for e in ALL_EVENTS}:
            raise ConfigError(
                path, f"unknown event {item!r} (expected {known})", job=job, field_name=field_name
            )
        events.append(NotifyEvent(item))
    return tuple(dict.fromkeys(events))


def _text(path: str, table: dict[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = table.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, "expected a non-empty string", field_name=f"{where}.{key}")
    return value


def _env_name(path: str, table: dict[str, Any], key: str, where: str) -> str | None:
    value = _text(path, table, key, where, required=False)
    if value is not None and (looks_like_secret(value) or not re.fullmatch(ENV_NAME, value)):
        raise ConfigError(
            path,
            "give the NAME of the environment variable that holds the secret "
            "(what was written is not repeated here)",
            field_name=f"{where}.{key}",
        )
    return value


_SINK_KEYS = {
    "webhook": {"kind", "url", "secret_env", "headers"},
    "slack": {"kind", "url", "url_env"},
    "smtp": {"kind", "host", "port", "from", "to", "starttls", "tls", "user", "password_env"},
}


def _url(path: str, table: dict[str, Any], where: str, *, required: bool) -> str | None:
    url = _text(path, table, "url", where, required=required)
    if url is not None and not url.startswith(("http://", "https://")):
        raise ConfigError(path, "must start with http:// or https://", field_name=f"{where}.url")
    return url


def _sink(path: str, name: str, table: Any) -> Sink:
    where = f"notify.{name}"
    if not re.fullmatch(SINK_NAME, name):
        raise ConfigError(
            path, "a sink name is 1-63 letters, digits, '_', '.', '-'", field_name=where
        )
    if not isinstance(table, dict):
        raise ConfigError(path, "a sink must be a table ([notify.NAME])", field_name=where)
    kind = table.get("kind")
    if kind not in _SINK_KEYS:
        raise ConfigError(path, "expected one of webhook, slack, smtp", field_name=f"{where}.kind")
    unknown = sorted(set(table) - _SINK_KEYS[kind])
    if unknown:
        raise ConfigError(
            path, f"unknown key for a {kind} sink", field_name=f"{where}.{unknown[0]}"
        )
    if kind == "webhook":
        headers = table.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(path, "expected a table of strings", field_name=f"{where}.headers")
        url = _url(path, table, where, required=True)
        assert url is not None
        return WebhookSink(
            name=name,
            url=url,
            secret_env=_env_name(path, table, "secret_env", where),
            headers=headers,
        )
    if kind == "slack":
        url = _url(path, table, where, required=False)
        url_env = _env_name(path, table, "url_env", where)
        if (url is None) == (url_env is None):
            raise ConfigError(path, "give exactly one of url or url_env", field_name=f"{where}.url")
        return SlackSink(name=name, url=url, url_env=url_env)
    return _smtp_sink(path, name, table, where)


def _smtp_sink(path: str, name: str, table: dict[str, Any], where: str) -> SmtpSink:
    host = _text(path, table, "host", where, required=True)
    sender = _text(path, table, "from", where, required=True)
    assert host is not None
    assert sender is not None
    port = table.get("port", 25)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(path, "expected a port number", field_name=f"{where}.port")
    to = table.get("to")
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not to or not all(isinstance(a, str) and "@" in a for a in to):
        raise ConfigError(path, "expected a list of e-mail addresses", field_name=f"{where}.to")
    flags = {}
    for key in ("starttls", "tls"):
        flags[key] = table.get(key, False)
        if not isinstance(flags[key], bool):
            raise ConfigError(path, "expected true or false", field_name=f"{where}.{key}")
    if flags["starttls"] and flags["tls"]:
        raise ConfigError(path, "give starttls or tls, not both", field_name=f"{where}.tls")
    return SmtpSink(
        name=name,
        host=host,
        port=port,
        sender=sender,
        to=tuple(to),
        starttls=flags["starttls"],
        tls=flags["tls"],
        user=_text(path, table, "user", where, required=False),
        password_env=_env_name(path, table, "password_env", where),
    )


def notify_from_table(path: str, raw: Any) -> NotifyConfig:
    """The ``[notify]`` table: scalar keys are its settings, tables are its sinks."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "must be a table", field_name="notify")
    sinks: dict[str, Sink] = {}
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            sinks[key] = _sink(path, key, value)
        elif key in _TOP_KEYS:
            settings[key] = value
        else:
            raise ConfigError(
                path, "unknown key (a sink is a table: [notify.NAME])", field_name=f"notify.{key}"
            )
    default = _names(path, settings.get("default", []), "notify.default")
    for name in default:
        if name not in sinks:
            raise ConfigError(path, f"no sink [notify.{name}]", field_name="notify.default")
    events = (
        _events(path, settings["events"], "notify.events")
        if "events" in settings
        else DEFAULT_EVENTS
    )
    durations = {
        key: _duration(path, settings[key], f"notify.{key}")
        for key in (*_DELIVERY_DURATIONS, "deadline")
        if key in settings
    }
    deadline = durations.pop("deadline", DEFAULT_DEADLINE)
    max_attempts = settings.get("max_attempts", NotifyDelivery.max_attempts)
    if (
        not isinstance(max_attempts, int)
        or isinstance(max_attempts, bool)
        or not 1 <= max_attempts <= 100
    ):
        raise ConfigError(
            path, "expected a whole number from 1 to 100", field_name="notify.max_attempts"
        )
    delivery = NotifyDelivery(max_attempts=max_attempts, **durations)
    if delivery.lease < delivery.timeout * 2:
        # The lease outlives a send: a live sender never sees its row taken by another.
        raise ConfigError(
            path,
            f"must be at least twice notify.timeout ({delivery.timeout.total_seconds():g}s), "
            "so a send ends before its lease does",
            field_name="notify.lease",
        )
    return NotifyConfig(
        sinks=sinks,
        default_sinks=default,
        default_events=events,
        default_deadline=deadline,
        delivery=delivery,
    )


def take_job_keys(raw: Any) -> dict[str, Any]:
    """The notification keys of a job table, taken out of it (the job's own model
    refuses unknown keys; these are not part of its stored definition)."""
    if not isinstance(raw, dict):
        return {}
    return {key: raw.pop(key) for key in JOB_KEYS if key in raw}


def job_notify(path: str, job: str, keys: dict[str, Any], sinks: dict[str, Sink]) -> JobNotify:
    """A job's notification keys, each error naming the job and the field."""
    own_sinks = None
    if "notify" in keys:
        own_sinks = _names(path, keys["notify"], "notify", job)
        for name in own_sinks:
            if name not in sinks:
                raise ConfigError(path, f"no sink [notify.{name}]", job=job, field_name="notify")
    events = _events(path, keys["notify_on"], "notify_on", job) if "notify_on" in keys else None
    tolerance = keys.get("failure_tolerance", 1)
    if not isinstance(tolerance, int) or isinstance(tolerance, bool) or not 1 <= tolerance <= 1000:
        raise ConfigError(
            path, "expected a whole number from 1 to 1000", job=job, field_name="failure_tolerance"
        )
    durations = {
        key: _duration(path, keys[key], key, job)
        for key in ("realert", "deadline", "too_long")
        if key in keys
    }
    if events is not None and NotifyEvent.TOO_LONG in events and "too_long" not in durations:
        raise ConfigError(
            path,
            "notify_on names too_long: give its bound in too_long",
            job=job,
            field_name="too_long",
        )
    return JobNotify(
        sinks=own_sinks,
        events=events,
        failure_tolerance=tolerance,
        realert=durations.get("realert"),
        deadline=durations.get("deadline"),
        too_long=durations.get("too_long"),
    )


def with_too_long(config: NotifyConfig) -> NotifyConfig:
    """A job that gives a too_long bound and no event list notifies too_long as well."""
    jobs = {}
    for name, own in config.jobs.items():
        if own.too_long is not None and own.events is None:
            own = replace(own, events=(*config.default_events, NotifyEvent.TOO_LONG))
        jobs[name] = own
    return replace(config, jobs=jobs)

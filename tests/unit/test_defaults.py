"""Every default is declared once (actors.domain.defaults): config, domain and stored
definitions agree on each.

A job and the settings built from a minimal config file are compared, field by
field, with the domain's dataclasses built with nothing but their required
fields, and with the defaults module; a stored definition missing its optional
fields reads back as the same job.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from actors.config import parse_config
from actors.domain import (
    DEFAULT_CLAIM_AHEAD,
    DEFAULT_LEASE,
    CronSchedule,
    HttpSpec,
    IntervalSchedule,
    Job,
    PythonSpec,
    RetryPolicy,
    decode_job,
    defaults,
    encode_job,
)
from actors.worker.settings import WorkerSettings

MINIMAL = """
[claimd]

[jobs.beat]
every = "1m"
run = { python = "tests.unit.jobfuncs:sync_job" }

[jobs.hook]
cron = "*/5 * * * *"
run = { http = { url = "https://example.internal/hook" } }
"""


def loaded_jobs() -> dict[str, Job]:
    loaded = parse_config(MINIMAL, "claimd.toml", env={})
    loaded.raise_for_errors()
    return loaded.jobs


def domain_jobs() -> dict[str, Job]:
    """The same jobs built in code, from their required fields alone."""
    return {
        "beat": Job(
            "beat",
            IntervalSchedule(timedelta(minutes=1)),
            PythonSpec("tests.unit.jobfuncs:sync_job"),
        ),
        "hook": Job("hook", CronSchedule("*/5 * * * *"), HttpSpec("https://example.internal/hook")),
    }


def fields_of(value: object) -> dict[str, Any]:
    assert dataclasses.is_dataclass(value)
    assert not isinstance(value, type)
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


@pytest.mark.parametrize("name", ["beat", "hook"])
def test_a_job_from_a_minimal_config_has_the_domains_defaults_in_every_field(name: str) -> None:
    from_config, in_code = loaded_jobs()[name], domain_jobs()[name]
    assert fields_of(from_config) == fields_of(in_code)
    assert fields_of(from_config.executor) == fields_of(in_code.executor)
    assert fields_of(from_config.retry) == fields_of(RetryPolicy())


def test_the_domains_dataclasses_read_the_defaults_module() -> None:
    job = loaded_jobs()["hook"]
    assert isinstance(job.schedule, CronSchedule)
    assert isinstance(job.executor, HttpSpec)
    assert {
        "timezone": job.schedule.timezone,
        "timeout": job.timeout,
        "max_attempts": job.max_attempts,
        "enabled": job.enabled,
        "overlap": job.overlap.value,
        "catchup": job.catchup.value,
        "catchup_window": job.catchup_window,
        "starting_deadline": job.starting_deadline,
        "jitter": job.jitter,
        "retry": (job.retry.initial, job.retry.maximum, job.retry.multiplier),
        "method": job.executor.method,
        "expect_status": job.executor.expect_status,
    } == {
        "timezone": defaults.TIMEZONE,
        "timeout": defaults.TIMEOUT,
        "max_attempts": defaults.MAX_ATTEMPTS,
        "enabled": defaults.ENABLED,
        "overlap": defaults.OVERLAP,
        "catchup": defaults.CATCHUP,
        "catchup_window": defaults.CATCHUP_WINDOW,
        "starting_deadline": None,
        "jitter": defaults.JITTER,
        "retry": (defaults.RETRY_INITIAL, defaults.RETRY_MAXIMUM, defaults.RETRY_MULTIPLIER),
        "method": defaults.HTTP_METHOD,
        "expect_status": defaults.HTTP_EXPECT_STATUS,
    }


def test_settings_from_a_minimal_config_have_the_domains_lease_and_worker_defaults() -> None:
    settings = parse_config(MINIMAL, "claimd.toml", env={}).settings
    assert settings.lease_settings == DEFAULT_LEASE
    assert (DEFAULT_LEASE.lease, DEFAULT_LEASE.ack_wait, DEFAULT_LEASE.max_deliver) == (
        defaults.LEASE,
        defaults.ACK_WAIT,
        defaults.MAX_DELIVER,
    )
    assert settings.effective_claim_ahead == DEFAULT_CLAIM_AHEAD == defaults.CLAIM_AHEAD
    assert settings.worker_async_concurrency == defaults.WORKER_ASYNC_CONCURRENCY
    worker = WorkerSettings.from_config(settings, "w")
    bare = WorkerSettings("w", "claimd", settings.lease, settings.lease / 4, 1, settings.lease)
    assert (worker.max_hold, worker.inline_concurrency, worker.keep_held_alive) == (
        bare.max_hold,
        bare.inline_concurrency,
        bare.keep_held_alive,
    )


# The fields a stored definition may lack, with where they sit in it.
OPTIONAL = [
    ("jitter_ms",),
    ("retry",),
    ("schedule", "timezone"),
    ("executor", "method"),
    ("executor", "expect_status"),
    ("executor", "headers"),
    ("executor", "body"),
    ("executor", "secret_headers"),
]


def test_a_stored_definition_without_its_optional_fields_reads_as_the_defaults() -> None:
    # Every claimd build wrote these fields; a row written by other means may not
    # have them, and reads as the job the config's defaults make (expect_status
    # included: it read as (200,) before the defaults were declared once).
    job = loaded_jobs()["hook"]
    stored = encode_job(job)
    for path in OPTIONAL:
        parent = stored
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    assert "expect_status" not in stored["executor"]
    assert decode_job("hook", stored) == job
    assert decode_job("hook", encode_job(job)) == job

"""The one codec for stored job definitions: round trip, versions, decoded once."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from actors.domain import (
    DEFINITION_VERSION,
    Catchup,
    CronSchedule,
    DecodedJobs,
    HttpSpec,
    IntervalSchedule,
    Job,
    Overlap,
    RetryPolicy,
    ShellSpec,
    UnreadableDefinition,
    decode_job,
    encode_job,
)

JOBS = [
    Job(
        "nightly",
        CronSchedule("0 2 * * *", "Europe/Berlin"),
        ShellSpec(("/bin/echo", "{scheduled_date}"), env={"A": "1"}, secret_env={"T": "TOKEN"}),
        timeout=timedelta(minutes=15),
        max_attempts=5,
        overlap=Overlap.FORBID,
        catchup=Catchup.LATEST,
        starting_deadline=timedelta(seconds=30),
        jitter=timedelta(seconds=2),
        retry=RetryPolicy(timedelta(seconds=3), timedelta(minutes=1), 1.5),
    ),
    Job(
        "beat",
        IntervalSchedule(timedelta(milliseconds=250)),
        HttpSpec("https://example.internal/hook", headers={"X": "y"}, expect_status=(200,)),
    ),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_a_job_survives_the_round_trip_through_json(job: Job) -> None:
    stored = json.dumps(encode_job(job))
    assert json.loads(stored)["version"] == DEFINITION_VERSION
    back = decode_job(job.name, stored)
    assert back == job
    # The version is the format's, not the job's: it is not in the fingerprint.
    assert back.fingerprint() == job.fingerprint()


def test_a_row_written_before_the_version_field_reads_as_version_1() -> None:
    assert decode_job("beat", JOBS[1].definition()) == JOBS[1]


def test_a_newer_version_is_refused_with_a_clear_error() -> None:
    newer = {**encode_job(JOBS[0]), "version": DEFINITION_VERSION + 1}
    with pytest.raises(
        UnreadableDefinition,
        match=r"job 'nightly': definition version 2 was written by a newer "
        r"claimd; this one reads up to version 1",
    ):
        decode_job("nightly", newer)
    with pytest.raises(UnreadableDefinition, match="not a positive whole number"):
        decode_job("nightly", {**encode_job(JOBS[0]), "version": "1"})


def test_each_definition_is_decoded_once_per_job_and_fingerprint() -> None:
    decoded = DecodedJobs(size=2)
    job = JOBS[1]
    text = json.dumps(encode_job(job))
    first = decoded.job("beat", job.fingerprint(), text)
    assert decoded.job("beat", job.fingerprint(), "not even json") is first
    # Two jobs with one definition are two jobs: the name is part of the key.
    assert decoded.job("other", job.fingerprint(), text).name == "other"
    # Bounded: the least recently used entry goes first.
    decoded.job("third", job.fingerprint(), text)
    with pytest.raises(ValueError):
        decoded.job("beat", job.fingerprint(), "not even json")


def test_a_job_without_inherit_env_keeps_the_fingerprint_it_had_before_the_key() -> None:
    # Computed by the build before inherit_env existed: an upgrade edits no job.
    assert JOBS[0].fingerprint() == (
        "e66be90d612185d7fbc5c7cfc9708e8b5002a30aad98e6fd1bd3428570f33e0d"
    )
    assert "inherit_env" not in JOBS[0].definition()["executor"]


def test_inherit_env_survives_the_round_trip_and_changes_the_fingerprint() -> None:
    spec = ShellSpec(("/bin/true",), inherit_env=("HTTPS_PROXY", "NO_PROXY"))
    job = Job("proxied", IntervalSchedule(timedelta(minutes=1)), spec)
    back = decode_job(job.name, json.dumps(encode_job(job)))
    assert back == job
    assert back.executor == spec
    plain = Job("proxied", IntervalSchedule(timedelta(minutes=1)), ShellSpec(("/bin/true",)))
    assert job.fingerprint() != plain.fingerprint()

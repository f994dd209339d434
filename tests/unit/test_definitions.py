"""The one codec for stored job definitions: round trip, versions, decoded once."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from actors.domain import (
    DEFAULT_DST,
    DEFINITION_VERSION,
    Catchup,
    CronSchedule,
    DecodedJobs,
    DstFold,
    DstGap,
    DstPolicy,
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
        "at-0230-both",
        CronSchedule("30 2 * * *", "Europe/Berlin", DstPolicy(DstGap.SKIP, DstFold.BOTH)),
        ShellSpec(("/bin/true",)),
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
    # Version 2 only for a definition that carries a dst policy (which an older
    # build must refuse rather than fire by the default rule).
    uses_dst = isinstance(job.schedule, CronSchedule) and job.schedule.dst != DEFAULT_DST
    assert json.loads(stored)["version"] == (DEFINITION_VERSION if uses_dst else 1)
    back = decode_job(job.name, stored)
    assert back == job
    # The version is the format's, not the job's: it is not in the fingerprint.
    assert back.fingerprint() == job.fingerprint()


def test_a_row_written_before_the_version_field_reads_as_version_1() -> None:
    assert decode_job("beat", JOBS[2].definition()) == JOBS[2]


def test_a_definition_stored_before_the_dst_policy_reads_with_cron8s_default() -> None:
    """A version-1 row (no "dst") decodes to the default, and its fingerprint is unchanged."""
    stored = {
        "version": 1,
        **{k: v for k, v in JOBS[0].definition().items()},
    }
    assert "dst" not in stored["schedule"]
    back = decode_job("nightly", stored)
    assert isinstance(back.schedule, CronSchedule)
    assert back.schedule.dst == DEFAULT_DST == DstPolicy(DstGap.SHIFT, DstFold.FIRST)
    assert back.fingerprint() == JOBS[0].fingerprint()
    # The policy is part of the definition, so of the fingerprint: setting it is an edit.
    assert JOBS[1].definition()["schedule"]["dst"] == {"gap": "skip", "fold": "both"}
    plain = Job("at-0230-both", CronSchedule("30 2 * * *", "Europe/Berlin"), JOBS[1].executor)
    assert plain.fingerprint() != JOBS[1].fingerprint()


def test_a_newer_version_is_refused_with_a_clear_error() -> None:
    newer = {**encode_job(JOBS[0]), "version": DEFINITION_VERSION + 1}
    with pytest.raises(
        UnreadableDefinition,
        match=r"job 'nightly': definition version 3 was written by a newer "
        r"claimd; this one reads up to version 2",
    ):
        decode_job("nightly", newer)
    with pytest.raises(UnreadableDefinition, match="not a positive whole number"):
        decode_job("nightly", {**encode_job(JOBS[0]), "version": "1"})


def test_each_definition_is_decoded_once_per_job_and_fingerprint() -> None:
    decoded = DecodedJobs(size=2)
    job = JOBS[2]
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

"""The rollout rule's ordering (actors.domain.generations): which file a sync may apply."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from actors.domain.generations import (
    ConfigIdentity,
    Generation,
    Standing,
    config_digest,
    disagreement,
    judge,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def gen(digest: str, version: int | None = None, seq: int = 2) -> Generation:
    return Generation(seq, digest, version, AT, "replica-a")


@pytest.mark.parametrize(
    ("file", "in_force", "seen", "force", "standing"),
    [
        # Nothing recorded: the first file is in force.
        (ConfigIdentity("old"), None, False, False, Standing.FIRST),
        # A digest never seen is a rollout forward.
        (ConfigIdentity("new"), gen("old"), False, False, Standing.NEWER),
        (ConfigIdentity("new"), gen("new"), True, False, Standing.IN_FORCE),
        # Seen before and superseded since: the replica that has not rolled yet.
        (ConfigIdentity("old"), gen("new"), True, False, Standing.STALE),
        # config_version decides first: lower is stale even for a digest never seen...
        (ConfigIdentity("other", 3), gen("new", 4), False, False, Standing.STALE),
        # ...higher is newer even for a digest seen before (a rollback by version).
        (ConfigIdentity("old", 5), gen("new", 4), True, False, Standing.NEWER),
        # Equal versions: the digest rule.
        (ConfigIdentity("old", 4), gen("new", 4), True, False, Standing.STALE),
        (ConfigIdentity("new", 4), gen("new", 4), True, False, Standing.IN_FORCE),
        # A version on one side only: the digest rule.
        (ConfigIdentity("old"), gen("new", 4), True, False, Standing.STALE),
        (ConfigIdentity("newer", 1), gen("new"), False, False, Standing.NEWER),
        # The operator's rollback applies whatever the history says.
        (ConfigIdentity("old", 1), gen("new", 4), True, True, Standing.FORCED),
        (ConfigIdentity("old"), None, False, True, Standing.FORCED),
    ],
)
def test_a_file_is_judged_against_the_generation_in_force(
    file: ConfigIdentity, in_force: Generation | None, seen: bool, force: bool, standing: Standing
) -> None:
    assert judge(file, in_force, seen_before=seen, force=force) is standing


def test_only_a_stale_file_is_refused_and_only_a_move_is_recorded() -> None:
    assert [s for s in Standing if not s.applies] == [Standing.STALE]
    assert {s for s in Standing if s.records} == {
        Standing.FIRST,
        Standing.NEWER,
        Standing.FORCED,
    }


def test_the_digest_is_the_job_set_in_any_order_not_the_settings() -> None:
    jobs = [("a", "f1", True), ("x", "f2", True)]
    assert config_digest(jobs) == config_digest(list(reversed(jobs)))
    assert config_digest(jobs) != config_digest(jobs[:1])  # a job removed
    assert config_digest(jobs) != config_digest([("a", "f1", True), ("x", "f3", True)])
    assert config_digest(jobs) != config_digest([("a", "f1", True), ("x", "f2", False)])
    # A rejected job (its stored definition kept) is part of what the file says.
    assert config_digest(jobs) != config_digest(jobs, kept=["b"])


def test_disagreement_names_each_digest_with_its_replicas_most_first() -> None:
    assert disagreement({}) is None
    assert disagreement({"a" * 64: 3}) is None
    assert disagreement({"b" * 64: 1, "a" * 64: 2}) == (
        f"replicas disagree: 2 on digest {'a' * 12}, 1 on digest {'b' * 12}"
    )

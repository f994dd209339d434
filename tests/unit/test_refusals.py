"""The reasons' words: one enum in the domain, the same words in the SQL that writes them."""

from __future__ import annotations

import pytest

from actors.adapters.postgres import statements
from actors.domain import RunState, SkipReason, StartRefusal, refusal_of


@pytest.mark.parametrize("reason", list(SkipReason))
def test_every_skip_reason_is_the_word_the_sql_writes(reason: SkipReason) -> None:
    # The statements import nothing (an import-linter contract): they carry the
    # words as literals, and this keeps them the enum's.
    sql = statements.claim.MUST_NOT_RUN + statements.claim.SKIP_UNRUNNABLE
    assert f"'{reason.value}'" in sql


@pytest.mark.parametrize(
    ("state", "epoch", "refusal"),
    [
        (None, None, StartRefusal.UNKNOWN),
        (RunState.SUCCEEDED, 1, StartRefusal.TERMINAL),
        (RunState.SKIPPED, 1, StartRefusal.TERMINAL),
        (RunState.RUNNING, 2, StartRefusal.STALE),
        (RunState.RUNNING, 1, StartRefusal.OWNED),
        (RunState.CLAIMED, 1, StartRefusal.EARLY),
        (RunState.CLAIMED, 2, StartRefusal.STALE),
        (RunState.PENDING, 1, StartRefusal.STALE),
    ],
)
def test_a_start_that_changed_nothing_says_why_from_the_row_read_back(
    state: RunState | None, epoch: int | None, refusal: StartRefusal
) -> None:
    assert refusal_of(state, epoch, 1) is refusal


def test_the_words_are_the_ones_logs_and_metrics_always_had() -> None:
    assert [str(r) for r in StartRefusal] == [
        "terminal",
        "owned",
        "stale",
        "unknown",
        "unreadable",
        "skipped",
        "early",
    ]

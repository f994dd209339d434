"""Broken builds for the chaos harness, installed around the store at start-up.

The harness proves that it catches a bug by running a replica with one
protection removed. The environment is read once, when the replica starts
(actors.app); nothing on a production path reads it or knows these exist.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from actors.adapters.postgres import COMPLETE_RUNS, PostgresRunStore
from actors.observability import get_logger

log = get_logger("faults")

# CLAIMD_FAULT_SKIP_EPOCH_GUARD=1: completions without their epoch guard, so
# the harness can show that it catches a zombie's late completion
# overwriting a newer attempt. Never set it outside the harness.
SKIP_EPOCH_GUARD = "CLAIMD_FAULT_SKIP_EPOCH_GUARD"

_FENCE = "r.claim_epoch = c.epoch AND r.state = 'running'"
# The same statement without its epoch guard.
COMPLETE_RUNS_UNFENCED = COMPLETE_RUNS.replace(_FENCE, "r.state = 'running'")
assert COMPLETE_RUNS_UNFENCED != COMPLETE_RUNS, "the completion's epoch guard moved"


def install_store_faults(
    store: PostgresRunStore, environ: Mapping[str, str] = os.environ
) -> PostgresRunStore:
    """``store``, with the broken builds the environment asks for (usually none)."""
    if environ.get(SKIP_EPOCH_GUARD) == "1":
        log.warning(
            "test fault installed: completions are not fenced by epoch", fault=SKIP_EPOCH_GUARD
        )
        store.complete_statement = COMPLETE_RUNS_UNFENCED
    return store

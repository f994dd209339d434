"""The materializer plans with the replica's own config job where it is the stored definition.

At 100,000 jobs, decoding every stored definition again at the first catalog
read was most of that read (bench_config_scale). A config job with the stored
fingerprint is the same definition, so it stands in; any other (edited here or
on another replica, a job this config lacks) is decoded from the store, as
before: plans still follow what is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from actors.domain import Job, definitions
from actors.scheduling.materializer import Materializer
from tests.unit.memory_world import job, world


async def test_a_config_job_with_the_stored_fingerprint_is_used_and_others_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    same = job("same", every=timedelta(minutes=1))
    edited = job("edited", every=timedelta(minutes=1))
    clock, store, _ = await world(same, edited)
    # This replica's config: "same" as stored, "edited" since changed elsewhere.
    config = {"same": same, "edited": replace(edited, max_attempts=7)}
    decoded: list[str] = []
    real = definitions.decode_job

    def counting(name: str, data: Mapping[str, Any] | str, enabled: bool = True) -> Job:
        decoded.append(name)
        return real(name, data, enabled)

    monkeypatch.setattr(definitions, "decode_job", counting)
    actor = Materializer(
        store,
        clock,
        timedelta(minutes=5),
        timedelta(seconds=1),
        asyncio.Event(),
        config_jobs=lambda: config,
    )
    assert await actor.tick() == 10
    assert decoded == ["edited"]
    planned = {p.state.name: p.job for p in actor._jobs.values()}
    assert planned["same"] is same
    assert planned["edited"].max_attempts == edited.max_attempts  # the stored one, not ours

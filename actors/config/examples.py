"""Example job functions for the shipped config.

config/jobs.toml runs ``run = { python = "actors.config.examples:hello" }``.
"""

from __future__ import annotations

from actors.domain import RunContext
from actors.observability import get_logger

log = get_logger("example")


def hello(ctx: RunContext) -> None:
    """Say which run this is; a real job would use ``ctx.run_id`` to dedupe its effect."""
    log.info(
        "hello from a python job",
        run_id=ctx.run_id,
        job=ctx.job,
        scheduled_at=ctx.scheduled_at.isoformat(),
        attempt=ctx.attempt,
    )

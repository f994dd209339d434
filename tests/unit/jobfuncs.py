"""Job functions the python executor tests call by ``module:function`` target."""

from __future__ import annotations

import asyncio

from actors.domain import RunContext

# Each function appends the context it was handed, so a test can see what it got.
SEEN: list[tuple[str, RunContext]] = []


def sync_job(ctx: RunContext) -> None:
    SEEN.append(("sync", ctx))


async def async_job(ctx: RunContext) -> None:
    await asyncio.sleep(0)
    SEEN.append(("async", ctx))


def failing_job(ctx: RunContext) -> None:
    raise RuntimeError(f"export for {ctx.job} broke")


async def failing_async_job(ctx: RunContext) -> None:
    await asyncio.sleep(0)
    raise ValueError("bad input for attempt " + str(ctx.attempt))


async def slow_async_job(ctx: RunContext) -> None:
    SEEN.append(("slow-start", ctx))
    await asyncio.sleep(60)
    SEEN.append(("slow-end", ctx))  # never reached: the timeout cancels the sleep


NOT_CALLABLE = 42


def leaking_job(ctx: RunContext) -> None:
    """Fails quoting a secret of claimd's environment (another job's) in its error."""
    import os

    raise RuntimeError("cannot use " + os.environ["CLAIMD_TEST_LEAKED_SECRET"])

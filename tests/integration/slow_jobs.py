"""Job functions for the shutdown tests."""

from __future__ import annotations

import time

from actors.domain import RunContext


def sleep_sync(ctx: RunContext) -> None:
    """A sync job far longer than any grace: its thread cannot be killed."""
    time.sleep(120)

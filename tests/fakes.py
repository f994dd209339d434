"""Fakes shared by the unit and integration tests."""

from __future__ import annotations


class RecordingDelivery:
    """A broker message that records how the worker settled it.

    ``settled`` holds the verdicts (ack, term, nak) in order; heartbeats
    (``in_progress``) are counted apart, since they settle nothing.
    """

    def __init__(self, data: bytes = b"m") -> None:
        self.data = data
        self.settled: list[str] = []
        self.progress_marks = 0

    async def ack(self) -> None:
        self.settled.append("ack")

    async def term(self) -> None:
        self.settled.append("term")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def in_progress(self) -> None:
        self.progress_marks += 1

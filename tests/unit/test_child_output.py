"""A warm child's one output pipe cut into attempts at the child's marker: wherever the
reads split it, and whatever the output holds that merely begins like it."""

from __future__ import annotations

import asyncio
import os

from actors.adapters.executors.child_output import MARK, ChildOutput
from actors.adapters.executors.common import Tail


async def test_the_marker_ends_the_attempt_wherever_two_reads_cut_it() -> None:
    output = ChildOutput(asyncio.get_running_loop())
    try:
        stream = b"line one\nno newline" + output.marker + b"after the end"
        for cut in range(len(stream) + 1):
            tail = Tail()
            ended = output.begin(tail)
            output.route(stream[:cut])
            output.route(stream[cut:])
            assert ended.result() is True, cut  # InvalidStateError if not set
            assert tail.text() == "line one\nno newline", cut
    finally:
        output.close()


async def test_output_that_only_begins_like_the_marker_is_the_attempts() -> None:
    output = ChildOutput(asyncio.get_running_loop())
    try:
        tail = Tail()
        ended = output.begin(tail)
        look_alike = MARK + os.urandom(8)
        output.route(b"a" + look_alike[:5])
        output.route(look_alike[5:] + b" and more\n")
        assert not ended.done()
        output.route(b"end" + output.marker)
        assert ended.result() is True
        assert tail.text() == (b"a" + look_alike + b" and more\nend").decode("utf-8", "replace")
    finally:
        output.close()


async def test_at_the_pipes_end_what_was_held_back_is_the_attempts() -> None:
    """A child that dies writes no marker: bytes held as a possible marker's beginning
    are output, given to the tail when the last writer is gone."""
    output = ChildOutput(asyncio.get_running_loop())
    write_fd = os.dup(output.write_fd)
    output.handed()
    tail = Tail()
    ended = output.begin(tail)
    os.write(write_fd, b"last words" + MARK[:6])
    os.close(write_fd)
    async with asyncio.timeout(10):
        await output.finish()
    assert tail.text() == (b"last words" + MARK[:6]).decode()
    # Closed at the end: no attempt waits on a marker that cannot come.
    assert ended.result() is False
    output.close()

"""Live output's relay, without a server: what one attempt publishes, and its bounds."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from actors.adapters.executors import LocalExecutor
from actors.adapters.executors.common import OUTPUT_SINK, Tail
from actors.adapters.live_output import (
    MAX_LINE,
    LiveOutputExecutor,
    OutputRelay,
    _AttemptOutput,
)
from actors.domain import ExecutorSpec, Outcome, PythonSpec, RunContext, ShellSpec
from actors.observability.secrets import MASKER
from actors.ports import OutputChunk
from actors.ports.execution import Preparing

CONTEXT = RunContext(
    run_id="5d1c7a52-3f3e-4e0e-9d51-6a1d2c3b4a59",
    job="talking",
    scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    attempt=2,
    fencing_token=7,
)
TIMEOUT = timedelta(seconds=30)


def test_whole_lines_are_published_and_the_rest_at_the_end() -> None:
    output = _AttemptOutput(attempt=1, rate=1 << 20)
    output.add(b"first line\nsecond, not ended")
    assert output.take() == "first line\n"
    output.add(b" yet\nthird")
    assert output.take() == "second, not ended yet\n"
    assert output.take(final=True) == "third"


def test_a_character_split_between_reads_is_decoded_whole() -> None:
    output = _AttemptOutput(attempt=1, rate=1 << 20)
    encoded = "größer\n".encode()
    output.add(encoded[:3])
    output.add(encoded[3:])
    assert output.take() == "größer\n"


def test_past_the_rate_bytes_are_dropped_and_said() -> None:
    rate = 64 * 1024
    dropped_before = REGISTRY.get_sample_value("claimd_live_output_dropped_bytes_total") or 0
    output = _AttemptOutput(attempt=1, rate=rate)
    line = b"x" * 1023 + b"\n"
    for _ in range(200):  # 200 KiB within one second
        output.add(line)
    text = output.take()
    kept, _, marker = text.partition("\n[claimd: ")
    assert len(kept) <= rate
    assert f"{200 * 1024 - rate} bytes dropped" in marker, marker
    dropped = REGISTRY.get_sample_value("claimd_live_output_dropped_bytes_total")
    assert dropped == dropped_before + 200 * 1024 - rate  # the metric an operator reads
    # What the bound cut is gone, not held: the buffer is empty after the take.
    assert output.take(final=True) == ""


def test_a_line_longer_than_the_bound_is_published_in_pieces() -> None:
    output = _AttemptOutput(attempt=1, rate=1 << 20)
    output.add(b"y" * (MAX_LINE + 10))
    assert len(output.take()) == MAX_LINE + 10


def test_secrets_are_masked_in_what_is_relayed() -> None:
    secret = "live-output-secret-5f0c2a9e"
    MASKER.add([secret])
    output = _AttemptOutput(attempt=1, rate=1 << 20)
    output.add(f"token={secret} ok\n".encode())
    text = output.take()
    assert secret not in text
    assert "ok" in text


def test_the_tail_of_what_was_published_is_bounded() -> None:
    output = _AttemptOutput(attempt=2, rate=1 << 20)
    for i in range(2000):
        output.published(f"line {i}\n")
    assert output.seq == 2000
    assert len(output.tail) <= 4096
    assert output.tail.endswith("line 1999\n")


def test_tails_made_while_a_sink_is_set_feed_it_from_any_thread() -> None:
    heard: list[bytes] = []
    lock = threading.Lock()

    def sink(chunk: bytes) -> None:
        with lock:
            heard.append(chunk)

    before = Tail()
    token = OUTPUT_SINK.set(sink)
    try:
        inside = Tail()
    finally:
        OUTPUT_SINK.reset(token)
    before.add(b"not relayed")
    threads = [threading.Thread(target=inside.add, args=(f"{i}\n".encode(),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(heard) == sorted(f"{i}\n".encode() for i in range(8))
    assert "7" in inside.text()


async def test_the_sink_reaches_tails_made_in_tasks_of_the_execution() -> None:
    heard: list[bytes] = []
    token = OUTPUT_SINK.set(heard.append)
    try:

        async def executor_side() -> None:
            Tail().add(b"from a task\n")

        await asyncio.ensure_future(executor_side())
    finally:
        OUTPUT_SINK.reset(token)
    assert heard == [b"from a task\n"]


class _Heard(OutputRelay):
    """The relay with what it would publish kept in a list (no NATS)."""

    def __init__(self) -> None:
        super().__init__("claimd.test")
        self.heard: list[OutputChunk] = []

    async def _publish(self, run_id: str, chunk: OutputChunk) -> None:
        self.heard.append(chunk)


@pytest.mark.parametrize(
    ("spec", "printed"),
    [
        (ShellSpec(argv=("/bin/sh", "-c", "echo from shell; echo to stderr >&2")), "from shell"),
        (PythonSpec("tests.unit.jobfuncs:talking_job"), "printed by attempt 2"),
        (PythonSpec("tests.unit.jobfuncs:talking_async_job"), "printed by attempt 2"),
    ],
    ids=["shell", "sync-python", "async-python"],
)
async def test_every_kind_of_execution_relays_its_output(spec: ExecutorSpec, printed: str) -> None:
    """The executors' Tails (shell, a sync python child, an async job's loop) feed the
    relay: a change in where an executor makes its Tail must keep it in the execution."""
    relay = _Heard()
    result = await LiveOutputExecutor(LocalExecutor(), relay).execute(spec, CONTEXT, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    text = "".join(chunk.text for chunk in relay.heard)
    assert printed in text, relay.heard
    assert relay.heard[-1].end  # and the end of the attempt is said
    assert [chunk.seq for chunk in relay.heard] == list(range(1, len(relay.heard) + 1))
    assert {chunk.attempt for chunk in relay.heard} == {CONTEXT.attempt}


async def test_a_silent_attempt_publishes_nothing_and_leaves_no_task() -> None:
    """A herd of runs that print nothing costs the relay no publish and no task per run:
    the end is said only of an attempt that printed or was followed."""
    relay = _Heard()
    spec = PythonSpec("tests.unit.jobfuncs:async_job")
    tasks_before = len(asyncio.all_tasks())
    results = await asyncio.gather(
        *(
            LiveOutputExecutor(LocalExecutor(), relay).execute(
                spec, replace(CONTEXT, run_id=f"run-{i}"), TIMEOUT
            )
            for i in range(200)
        )
    )
    assert {r.outcome for r in results} == {Outcome.SUCCEEDED}
    assert relay.heard == []
    await asyncio.sleep(0)  # the flusher's last turn ends once nothing is relayed
    assert len(asyncio.all_tasks()) <= tasks_before + 1  # at most the flusher, ending


async def test_a_followed_silent_attempt_is_told_its_end() -> None:
    relay = _Heard()
    output, token = relay.begin(CONTEXT)
    output.followed = True  # what answering a follower's tail request marks
    await relay.end(CONTEXT, output, token)
    assert [(c.text, c.end) for c in relay.heard] == [("", True)]


async def test_output_is_published_while_the_attempt_still_runs() -> None:
    relay = _Heard()
    output, token = relay.begin(CONTEXT)
    try:
        Tail().add(b"half way\n")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not relay.heard and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert [(c.text, c.end) for c in relay.heard] == [("half way\n", False)]
    finally:
        await relay.end(CONTEXT, output, token)
    assert relay.heard[-1].end


def test_the_relaying_executor_passes_on_what_is_coming() -> None:
    """In a replica the executor is wrapped by the relay: the warm children of a sync
    python job's held runs must still be forked before their instant."""
    asked: list[tuple[str | None, int]] = []

    class Inner(LocalExecutor):
        def prepare(self, executor: str | None, count: int = 1) -> None:
            asked.append((executor, count))

    wrapped = LiveOutputExecutor(Inner(), _Heard())
    assert isinstance(wrapped, Preparing)
    wrapped.prepare("python:billing:charge", 40)
    assert asked == [("python:billing:charge", 40)]

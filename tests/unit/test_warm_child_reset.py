"""A warm child's next attempt sees nothing of what the last one changed or left running.

Each test runs a job that changes something (``resetfuncs.py``), then one that looks
at it, in the same child (one child in the pool: the pid says so). The child sets
again only what the last attempt changed (``warm_reset.py``): these fail when a
change goes unseen.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.executors import LocalExecutor
from actors.domain import ExecutionResult, Outcome, PythonSpec, RunContext

from .resetfuncs import STREAM_CHANGES

TIMEOUT = timedelta(seconds=30)
RUN_ID = "6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10"
TRACE = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)


async def _run(
    executor: LocalExecutor, job: str, attempt: int, trace: tuple[tuple[str, str], ...] = ()
) -> ExecutionResult:
    context = RunContext(RUN_ID, "reset", datetime.now(UTC), attempt, 1, trace)
    async with asyncio.timeout(60):
        result = await executor.execute(
            PythonSpec(f"tests.unit.resetfuncs:{job}"), context, TIMEOUT
        )
    assert result.outcome is Outcome.SUCCEEDED, result
    return result


def _lines(result: ExecutionResult) -> list[str]:
    assert result.output_tail is not None, result
    return result.output_tail.splitlines()


def _pid(result: ExecutionResult) -> int:
    return int(_lines(result)[0].split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two variables of the job environment (set before the fork server starts)."""
    monkeypatch.setenv("RESET_BASE", "base")
    monkeypatch.setenv("RESET_GONE", "there")


def _seen(attempt: int, trace: str | None = None) -> dict[str, str | None]:
    return {
        "RESET_LEFT": None,
        "RESET_BASE": "base",
        "RESET_GONE": "there",
        "CLAIMD_JOB": "reset",
        "CLAIMD_ATTEMPT": str(attempt),
        "TRACEPARENT": trace,
    }


@pytest.mark.usefixtures("environment")
@pytest.mark.parametrize(
    "job", ["environ_changing_job", "environ_rebinding_job", "environ_deleting_job"]
)
async def test_the_environment_is_the_base_and_the_runs_whatever_the_last_attempt_did(
    job: str,
) -> None:
    executor = LocalExecutor(python_processes=1)
    changed = await _run(executor, job, 1)
    looked = await _run(executor, "environ_looking_job", 2)
    assert _pid(looked) == _pid(changed)
    assert _lines(looked)[1:] == [f"python {_seen(2)}", f"program {_seen(2)}"]


@pytest.mark.usefixtures("environment")
async def test_a_runs_variables_go_with_it_when_the_last_attempt_left_the_environment_alone() -> (
    None
):
    """The cheap path (os.environ untouched): only the runs' variables are set, and one the
    last run had and this one has not (its trace context) is gone."""
    executor = LocalExecutor(python_processes=1)
    traced = await _run(executor, "environ_looking_job", 1, TRACE)
    untraced = await _run(executor, "environ_looking_job", 2)
    traced_again = await _run(executor, "environ_looking_job", 3, TRACE)
    assert _pid(traced) == _pid(untraced) == _pid(traced_again)
    assert _lines(traced)[1:] == [
        f"python {_seen(1, TRACE[0][1])}",
        f"program {_seen(1, TRACE[0][1])}",
    ]
    assert _lines(untraced)[1:] == [f"python {_seen(2)}", f"program {_seen(2)}"]
    assert _lines(traced_again)[1:] == [
        f"python {_seen(3, TRACE[0][1])}",
        f"program {_seen(3, TRACE[0][1])}",
    ]


@pytest.mark.parametrize("change", sorted(STREAM_CHANGES))
async def test_stdout_stderr_and_the_root_logger_are_as_set_whatever_the_last_attempt_did(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESET_CHANGE", change)
    executor = LocalExecutor(python_processes=1)
    before = await _run(executor, "streams_looking_job", 1)
    changed = await _run(executor, "streams_changing_job", 2)
    after = await _run(executor, "streams_looking_job", 3)
    assert _pid(before) == _pid(changed) == _pid(after)
    expected = [
        "printed",
        "to stderr",
        f"INFO look job=reset run_id={RUN_ID}: logged",
        f"INFO root job=reset run_id={RUN_ID}: logged on the root logger",
        "handlers 1 blocking True",
    ]
    assert _lines(before)[1:] == expected
    assert after.output_tail == f"pid {_pid(after)} attempt 3\n" + "\n".join(expected) + "\n"


async def test_signal_handlers_are_the_defaults_no_alarm_is_pending_and_the_cwd_is_home() -> None:
    """In the kernel's view: SIGTERM's handler, set by the C library behind python's back,
    is gone too (a SIGTERM at the timeout ends the attempt at once)."""
    executor = LocalExecutor(python_processes=1)
    changed = await _run(executor, "signals_changing_job", 1)
    looked = await _run(executor, "signals_looking_job", 2)
    assert _pid(looked) == _pid(changed)
    assert _lines(looked)[1:] == [f"not default [] alarm 0 cwd {os.getcwd()}"]


async def test_a_thread_started_below_threading_retires_its_child() -> None:
    executor = LocalExecutor(python_processes=1)
    left = await _run(executor, "raw_thread_leaving_job", 1)
    assert not _alive(_pid(left))
    nxt = await _run(executor, "streams_looking_job", 2)
    assert _pid(nxt) != _pid(left)


async def test_a_thread_left_is_seen_when_the_job_replaced_the_childs_view_of_its_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child reads its threads from a descriptor it holds: one the job closed and put
    another directory in place of is not taken for it."""
    monkeypatch.setenv("RESET_FOLDER", str(tmp_path))
    executor = LocalExecutor(python_processes=1)
    left = await _run(executor, "task_view_replacing_job", 1)
    assert not _alive(_pid(left))
    nxt = await _run(executor, "streams_looking_job", 2)
    assert _pid(nxt) != _pid(left)


async def test_an_orphan_of_the_jobs_program_retires_its_child_and_is_ended_with_it() -> None:
    """The program's parent ended: its orphan is given to the child (a subreaper), which
    is not reused; the orphan is swept with the child's group before the verdict."""
    executor = LocalExecutor(python_processes=1)
    left = await _run(executor, "orphan_leaving_job", 1)
    orphan = int(_lines(left)[1].split()[1])
    assert not _alive(_pid(left))
    # Sent SIGKILL before the verdict (it runs no more of its code), it may take a moment
    # to be gone from the process table.
    deadline = time.monotonic() + 30
    while _alive(orphan):
        assert time.monotonic() < deadline, f"the orphan {orphan} outlived its child"
        await asyncio.sleep(0.01)
    nxt = await _run(executor, "streams_looking_job", 2)
    assert _pid(nxt) != _pid(left)


async def test_a_child_process_that_ended_unreaped_leaves_the_child_reusable() -> None:
    executor = LocalExecutor(python_processes=1)
    left = await _run(executor, "zombie_leaving_job", 1)
    nxt = await _run(executor, "streams_looking_job", 2)
    assert _pid(nxt) == _pid(left)


def test_a_request_is_read_whole_with_the_descriptor_that_came_with_it() -> None:
    """The child reads requests into one buffer of its own (not a new 1 MiB bytes object
    each): the bytes, and the output pipe passed with the first one."""
    import mmap
    import socket

    from actors.adapters.executors.warm_child import MESSAGE_LIMIT, _receive

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    buffer = memoryview(mmap.mmap(-1, MESSAGE_LIMIT))
    read_fd, write_fd = os.pipe()
    try:
        socket.send_fds(ours, [b"first request"], [write_fd])
        ours.send(b"second")
        size, fds = _receive(theirs, buffer)
        assert (bytes(buffer[:size]), len(fds)) == (b"first request", 1)
        os.write(fds[0], b"through the passed end")
        os.close(fds[0])
        assert os.read(read_fd, 100) == b"through the passed end"
        size, fds = _receive(theirs, buffer)
        assert (bytes(buffer[:size]), fds) == (b"second", [])
        ours.close()
        assert _receive(theirs, buffer) == (0, [])
    finally:
        buffer.release()
        theirs.close()
        os.close(read_fd)
        os.close(write_fd)

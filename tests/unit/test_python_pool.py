"""The warm pool of sync python children: reused from attempt to attempt, ended only when
an attempt overruns, dies or leaves something running, and never mixing attempts' output."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.executors import LocalExecutor
from actors.domain import ExecutionResult, Outcome, PythonSpec, RunContext

TIMEOUT = timedelta(seconds=30)


def _context(attempt: int) -> RunContext:
    return RunContext(
        "6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10", "pooled", datetime.now(UTC), attempt, 1
    )


async def _run(
    executor: LocalExecutor, target: str, attempt: int, timeout: timedelta = TIMEOUT
) -> ExecutionResult:
    async with asyncio.timeout(60):
        return await executor.execute(PythonSpec(target), _context(attempt), timeout)


def _pid(result: ExecutionResult) -> int:
    assert result.output_tail is not None, result
    return int(result.output_tail.split()[1])


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_one_warm_child_serves_attempt_after_attempt() -> None:
    executor = LocalExecutor(python_processes=1)
    first = await _run(executor, "tests.unit.jobfuncs:pid_job", 1)
    second = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert first.outcome is second.outcome is Outcome.SUCCEEDED, (first, second)
    assert _pid(first) == _pid(second)  # no fork for the second attempt
    assert _pid(first) != os.getpid()  # and not in the replica's process
    assert executor.python.pool.idle == 1


async def test_each_attempt_keeps_its_own_output() -> None:
    """One child runs both attempts; each attempt's tail holds its own lines only."""
    executor = LocalExecutor(python_processes=1)
    first = await _run(executor, "tests.unit.jobfuncs:talking_job", 1)
    second = await _run(executor, "tests.unit.jobfuncs:talking_job", 2)
    assert first.output_tail is not None
    assert second.output_tail is not None
    assert first.output_tail.splitlines() == [
        "printed by attempt 1",
        "to stderr",
        "INFO talking job=pooled run_id=6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10: logged at info",
    ]
    assert second.output_tail.splitlines() == [
        "printed by attempt 2",
        "to stderr",
        "INFO talking job=pooled run_id=6c1f8a0e-0b0e-4c39-9a55-3a7d8f1f2e10: logged at info",
    ]


async def test_a_timed_out_attempt_is_dead_before_the_retry_which_gets_a_new_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBFUNCS_PID_FILE", str(tmp_path / "pid"))
    executor = LocalExecutor(python_processes=1)
    executor.python.kill_grace = 0.5
    warm = await _run(executor, "tests.unit.jobfuncs:pid_job", 1)
    timed_out = await _run(
        executor, "tests.unit.jobfuncs:sleeping_job", 2, timeout=timedelta(seconds=1)
    )
    assert timed_out.outcome is Outcome.TIMED_OUT, timed_out
    assert timed_out.output_tail == "about to sleep\n"  # read to the killed child's end
    sleeper = int((tmp_path / "pid").read_text())
    assert sleeper == _pid(warm)  # the warm child ran it
    assert not _alive(sleeper)  # dead (and reaped) when the verdict came back
    retry = await _run(executor, "tests.unit.jobfuncs:pid_job", 3)
    assert retry.outcome is Outcome.SUCCEEDED, retry
    assert _pid(retry) != sleeper  # a new child in its place


async def test_a_child_that_dies_fails_its_attempt_and_is_replaced() -> None:
    executor = LocalExecutor(python_processes=1)
    crashed = await _run(executor, "tests.unit.jobfuncs:crashing_job", 1)
    assert crashed.outcome is Outcome.FAILED, crashed
    assert crashed.error == "the job's process ended without a verdict (exit status 3)"
    assert crashed.output_tail is not None
    assert "about to crash" in crashed.output_tail
    dead = _pid(crashed)
    assert not _alive(dead)
    again = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert again.outcome is Outcome.SUCCEEDED, again
    assert _pid(again) != dead


@pytest.mark.parametrize(
    "target",
    ["tests.unit.jobfuncs:thread_leaving_job", "tests.unit.jobfuncs:process_leaving_job"],
    ids=["thread", "process"],
)
async def test_an_attempt_that_leaves_something_running_retires_its_child(target: str) -> None:
    """What the attempt left ends with its child, before the verdict: a late line of
    it reaches neither the next attempt's output nor any other."""
    executor = LocalExecutor(python_processes=1)
    left = await _run(executor, target, 1)
    assert left.outcome is Outcome.SUCCEEDED, left
    retired = _pid(left)
    assert not _alive(retired)
    nxt = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert _pid(nxt) != retired
    assert nxt.output_tail == f"pid {_pid(nxt)} attempt 2\n"


async def test_a_warm_child_imports_an_edited_module_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the fork server does: a sync job runs its module as the file is now."""
    module = tmp_path / "pool_edited_job.py"
    module.write_text("def job(ctx):\n    print('version 1')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    executor = LocalExecutor(python_processes=1)
    first = await _run(executor, "pool_edited_job:job", 1)
    assert first.output_tail == "version 1\n", first
    module.write_text("def job(ctx):\n    print('version 2, longer')\n")
    second = await _run(executor, "pool_edited_job:job", 2)
    assert second.output_tail == "version 2, longer\n", second


async def test_attempts_beyond_the_pool_wait_for_a_child_and_all_finish() -> None:
    executor = LocalExecutor(python_processes=2)
    results = await asyncio.gather(
        *(_run(executor, "tests.unit.jobfuncs:pid_job", i) for i in range(1, 41))
    )
    assert {r.outcome for r in results} == {Outcome.SUCCEEDED}
    assert len({_pid(r) for r in results}) <= 2


async def test_runs_held_for_their_instant_get_their_children_forked_ahead() -> None:
    """prepare (the worker calls it for the runs it holds): warm children wait for them,
    within the pool's size; an async job's runs need none."""
    executor = LocalExecutor(python_processes=3)
    executor.prepare("python:tests.unit.jobfuncs:async_job", 5)
    executor.prepare("python:tests.unit.jobfuncs:pid_job", 5)
    pool = executor.python.pool
    async with asyncio.timeout(60):
        while pool.idle < 3:
            await asyncio.sleep(0.05)
    result = await _run(executor, "tests.unit.jobfuncs:pid_job", 1)
    assert result.outcome is Outcome.SUCCEEDED
    assert pool.idle == 3  # it ran on one of them, and no fourth was forked


def test_python_runs_take_the_python_pool_of_slots_shell_and_http_a_process_slot() -> None:
    """A herd of sync runs is started at its instant, not a process slot's worth at a time:
    the warm pool, not worker_concurrency, bounds how many execute at once."""
    executor = LocalExecutor()
    assert executor.runs_inline("python:tests.unit.jobfuncs:sync_job")
    assert executor.runs_inline("python:tests.unit.jobfuncs:async_job")
    assert not executor.runs_inline("shell")
    assert not executor.runs_inline(None)


async def test_after_a_childs_first_attempt_no_attempt_makes_a_pipe_or_passes_a_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child's output pipe is made and passed once, with its first attempt: a pipe and
    an fd-passing message per attempt were a fifth of a replica's CPU in a herd."""
    import socket

    made: list[int] = []
    passed: list[int] = []
    pipe, send_fds = os.pipe, socket.send_fds

    def counted_pipe() -> tuple[int, int]:
        made.append(1)
        return pipe()

    def counted_send_fds(sock: socket.socket, buffers: list[bytes], fds: list[int]) -> int:
        passed.append(len(fds))
        return send_fds(sock, buffers, fds)

    monkeypatch.setattr(os, "pipe", counted_pipe)
    monkeypatch.setattr(socket, "send_fds", counted_send_fds)
    executor = LocalExecutor(python_processes=1)
    first = await _run(executor, "tests.unit.jobfuncs:pid_job", 1)
    made_first, passed_first = len(made), len(passed)
    later = [await _run(executor, "tests.unit.jobfuncs:pid_job", n) for n in range(2, 7)]
    assert {_pid(r) for r in later} == {_pid(first)}  # one child served them all
    assert [r.output_tail for r in later] == [
        f"pid {_pid(first)} attempt {n}\n" for n in range(2, 7)
    ]
    assert (len(made), len(passed)) == (made_first, passed_first)


async def test_two_hundred_attempts_in_one_child_each_keep_their_own_output() -> None:
    """Python's lines, a program's it ran and stderr without a newline: each attempt's
    tail is its own, cut from the child's one pipe at each attempt's end."""
    executor = LocalExecutor(python_processes=1)
    results = [await _run(executor, "tests.unit.jobfuncs:echoing_job", n) for n in range(1, 201)]
    pid = _pid(results[0])
    for n, result in enumerate(results, 1):
        assert result.outcome is Outcome.SUCCEEDED, result
        assert result.output_tail == f"pid {pid} python {n}\necho {n}\nstderr {n}", result


async def test_a_job_that_replaces_its_output_pipe_keeps_its_verdict_and_output() -> None:
    """The child's own copy of the pipe gone (the job closed it and opened another file in
    its place): the attempt's end cannot be marked, so the child is not reused; the
    attempt's output and verdict stand, and the next attempt's output is its own."""
    executor = LocalExecutor(python_processes=1)
    replaced = await _run(executor, "tests.unit.jobfuncs:pipe_replacing_job", 1)
    assert replaced.outcome is Outcome.SUCCEEDED, replaced
    assert replaced.output_tail == f"pid {_pid(replaced)} replaced its output pipe's copies\n"
    nxt = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert nxt.outcome is Outcome.SUCCEEDED, nxt
    assert nxt.output_tail == f"pid {_pid(nxt)} attempt 2\n"
    assert _pid(nxt) != _pid(replaced)


async def test_an_answer_without_its_outputs_end_ends_the_child_and_keeps_the_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child answered reusable but its marker was not read in time (a loop stalled
    for seconds): the child is ended, not reused, and the verdict and output stand."""
    from actors.adapters.executors import pool as pool_module

    async def never(ended: asyncio.Future[bool]) -> bool:
        return False

    monkeypatch.setattr(pool_module, "_marked", never)
    executor = LocalExecutor(python_processes=1)
    first = await _run(executor, "tests.unit.jobfuncs:pid_job", 1)
    assert first.outcome is Outcome.SUCCEEDED, first
    assert first.output_tail == f"pid {_pid(first)} attempt 1\n"
    assert not _alive(_pid(first))
    second = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert second.output_tail == f"pid {_pid(second)} attempt 2\n"
    assert _pid(second) != _pid(first)


async def test_an_attempt_cancelled_while_its_output_end_is_awaited_keeps_not_its_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given back before its marker was read, a child's stale marker would end the next
    attempt's output early: a cancelled wait (a shutdown, a lost lease) lets it go."""
    from actors.adapters.executors import pool as pool_module

    waiting = asyncio.Event()

    async def stuck(ended: asyncio.Future[bool]) -> bool:
        waiting.set()
        await asyncio.Event().wait()
        return True

    monkeypatch.setattr(pool_module, "_marked", stuck)
    executor = LocalExecutor(python_processes=1)
    cancelled = asyncio.ensure_future(_run(executor, "tests.unit.jobfuncs:pid_job", 1))
    async with asyncio.timeout(60):
        await waiting.wait()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    monkeypatch.undo()
    assert executor.python.pool.idle == 0
    nxt = await _run(executor, "tests.unit.jobfuncs:pid_job", 2)
    assert nxt.output_tail == f"pid {_pid(nxt)} attempt 2\n", nxt


async def test_a_child_is_let_go_after_its_attempts_and_a_new_one_serves_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each attempt's own CLAIMD_* values stay in a child's memory for good (glibc's
    setenv): a child serves RETIRE_AFTER attempts, then a new one is forked."""
    from actors.adapters.executors import pool

    monkeypatch.setattr(pool, "RETIRE_AFTER", 3)
    executor = LocalExecutor(python_processes=1)
    pids = [_pid(await _run(executor, "tests.unit.jobfuncs:pid_job", n)) for n in range(1, 5)]
    assert pids[0] == pids[1] == pids[2]
    assert pids[3] != pids[0]  # the fourth attempt in a new child
    async with asyncio.timeout(10):
        while _alive(pids[0]):
            await asyncio.sleep(0.01)  # the retired child exits once its socket closes

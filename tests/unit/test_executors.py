"""Executors on local processes: identity in the environment, outcomes, timeouts that kill."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.executors import OUTPUT_TAIL_BYTES, LocalExecutor, run_python, run_shell
from actors.domain import Outcome, PythonSpec, RunContext, ShellSpec
from tests.unit import jobfuncs

CTX = RunContext(
    run_id="0b5c7a52-3f3e-4e0e-9d51-6a1d2c3b4a59",
    job="nightly-export",
    scheduled_at=datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    attempt=2,
    fencing_token=7,
)
TIMEOUT = timedelta(seconds=30)
GRACE = 0.5  # a short kill grace keeps the timeout tests quick


@pytest.fixture(autouse=True)
def clear_seen() -> Iterator[None]:
    jobfuncs.SEEN.clear()
    yield
    jobfuncs.SEEN.clear()


# -- shell ---------------------------------------------------------------------------------


async def test_shell_job_gets_its_identity_and_templated_argv() -> None:
    script = (
        'printf "arg=%s\\n" "$1" "$2"; '
        'env | grep -E "^CLAIMD_(RUN_ID|JOB|SCHEDULED_AT|ATTEMPT|FENCING_TOKEN)=" | sort; '
        'echo "MINE=$MINE"'
    )
    spec = ShellSpec(
        argv=(
            "/bin/sh",
            "-c",
            script,
            "sh",
            "--date={scheduled_date}",
            "{run_id}/{attempt}/{unknown}",
        ),
        # The job's own env cannot pose as another run.
        env={"MINE": "kept", "CLAIMD_RUN_ID": "forged"},
    )
    result = await run_shell(spec, CTX, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    assert result.exit_code == 0
    assert result.output_tail is not None
    lines = result.output_tail.splitlines()
    assert lines == [
        "arg=--date=2026-03-29",
        f"arg={CTX.run_id}/2/{{unknown}}",  # only names claimd defines are replaced
        "CLAIMD_ATTEMPT=2",
        "CLAIMD_FENCING_TOKEN=7",
        "CLAIMD_JOB=nightly-export",
        f"CLAIMD_RUN_ID={CTX.run_id}",
        "CLAIMD_SCHEDULED_AT=2026-03-29T01:00:00+00:00",
        "MINE=kept",
    ]


async def test_shell_string_with_use_shell_is_templated_too(tmp_path: Path) -> None:
    spec = ShellSpec(
        argv=("echo {job} {scheduled_date} > out.txt && echo $CLAIMD_ATTEMPT",),
        use_shell=True,
        cwd=str(tmp_path),
    )
    result = await run_shell(spec, CTX, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    assert (tmp_path / "out.txt").read_text() == "nightly-export 2026-03-29\n"
    assert result.output_tail == "2\n"


async def test_non_zero_exit_fails_with_code_and_output_tail() -> None:
    spec = ShellSpec(argv=("/bin/sh", "-c", "echo working; echo 'disk full' >&2; exit 3"))
    result = await run_shell(spec, CTX, TIMEOUT)
    assert result.outcome is Outcome.FAILED
    assert result.exit_code == 3
    assert result.error == "exit status 3"
    assert result.output_tail == "working\ndisk full\n"  # stderr is in the tail as well


async def test_output_tail_is_bounded_and_keeps_the_end() -> None:
    spec = ShellSpec(
        argv=(
            "/bin/sh",
            "-c",
            "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; echo THE-END; exit 1",
        )
    )
    result = await run_shell(spec, CTX, TIMEOUT)
    assert result.outcome is Outcome.FAILED
    assert result.output_tail is not None
    assert len(result.output_tail.encode()) <= OUTPUT_TAIL_BYTES
    assert result.output_tail.endswith("line-2999\nTHE-END\n")
    assert "line-0\n" not in result.output_tail


async def test_program_that_cannot_start_fails() -> None:
    result = await run_shell(ShellSpec(argv=("/nonexistent/export",)), CTX, TIMEOUT)
    assert result.outcome is Outcome.FAILED
    assert result.exit_code is None
    assert result.error is not None
    assert "cannot start '/nonexistent/export'" in result.error


# The leader and its child: both must be gone after a timeout or a cancellation.

PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Orphans of this test re-parent to this process, so it can reap them.

    Without it they go to PID 1, which in a container may never reap them:
    a killed child would linger as a zombie and ``os.kill(pid, 0)`` would
    still succeed.
    """
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux prctl(PR_SET_CHILD_SUBREAPER)")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) refused")
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it became our zombie
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _wait_until_gone(pids: list[int], deadline: float = 15.0) -> list[int]:
    """The pids still alive when the deadline passed (empty: all gone)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while True:
        alive = [pid for pid in pids if not _gone(pid)]
        if not alive or loop.time() > end:
            return alive
        await asyncio.sleep(0.05)


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


async def _read_pid(path: Path, deadline: float = 15.0) -> int:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while loop.time() < end:
        if (pid := _pid_in(path)) is not None:
            return pid
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def _kill_leftovers(folder: Path, argument: bytes = b"300") -> None:
    """Whatever happened, leave no sleeper behind."""
    for name in ("leaderpid", "childpid"):
        pid = _pid_in(folder / name)
        if pid is None:
            continue
        try:  # only ours: the pid may have been reused since
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if argument not in cmdline:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


# The sleeps outlast every deadline here: only a kill ends them in time. `exec`
# makes the leader itself the second sleeper, so the two pids are the whole group.
SPAWNING_JOB = "echo $$ > leaderpid; sleep 300 & echo $! > childpid; exec sleep 300"


@pytest.mark.usefixtures("subreaper")
@pytest.mark.parametrize("ignore_term", [False, True], ids=["obeys-sigterm", "ignores-sigterm"])
async def test_timeout_kills_the_leader_and_its_child(tmp_path: Path, ignore_term: bool) -> None:
    # With TERM ignored (inherited by the child), only the SIGKILL after the grace works.
    command = ("trap '' TERM; " if ignore_term else "") + SPAWNING_JOB
    spec = ShellSpec(argv=(command,), use_shell=True, cwd=str(tmp_path))
    try:
        async with asyncio.timeout(30):  # a child left holding stdout would hang here
            result = await run_shell(spec, CTX, timedelta(seconds=2), kill_grace=GRACE)
        pids = [await _read_pid(tmp_path / "leaderpid"), await _read_pid(tmp_path / "childpid")]
        assert result.outcome is Outcome.TIMED_OUT
        assert result.error is not None
        assert "timed out after 0:00:02" in result.error
        assert await _wait_until_gone(pids) == []
    finally:
        _kill_leftovers(tmp_path)


@pytest.mark.usefixtures("subreaper")
async def test_timeout_kills_a_setsid_child_that_left_the_group(tmp_path: Path) -> None:
    # setsid: a new session and process group, out of reach of killpg. The
    # leader ignores TERM, so the SIGKILL sweep of the tree is what ends both.
    command = (
        "trap '' TERM; echo $$ > leaderpid; setsid sleep 1000 & echo $! > childpid; exec sleep 1000"
    )
    spec = ShellSpec(argv=(command,), use_shell=True, cwd=str(tmp_path))
    try:
        async with asyncio.timeout(30):
            result = await run_shell(spec, CTX, timedelta(seconds=2), kill_grace=GRACE)
        child = await _read_pid(tmp_path / "childpid")
        assert result.outcome is Outcome.TIMED_OUT
        assert await _wait_until_gone([child]) == [], "the setsid child outlived the timeout"
    finally:
        _kill_leftovers(tmp_path, b"1000")


@pytest.mark.usefixtures("subreaper")
async def test_cancellation_kills_the_leader_and_its_child(tmp_path: Path) -> None:
    spec = ShellSpec(argv=(SPAWNING_JOB,), use_shell=True, cwd=str(tmp_path))
    task = asyncio.create_task(run_shell(spec, CTX, timedelta(minutes=5), kill_grace=GRACE))
    try:
        pids = [await _read_pid(tmp_path / "leaderpid"), await _read_pid(tmp_path / "childpid")]
        assert not _gone(pids[1])  # really running before the cancel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _wait_until_gone(pids) == []
    finally:
        task.cancel()
        _kill_leftovers(tmp_path)


@pytest.mark.usefixtures("subreaper")
async def test_leader_exit_ends_the_run_even_if_a_child_holds_stdout(tmp_path: Path) -> None:
    spec = ShellSpec(
        argv=("sleep 300 & echo $! > childpid; echo done",), use_shell=True, cwd=str(tmp_path)
    )
    try:
        async with asyncio.timeout(30):
            result = await run_shell(spec, CTX, timedelta(seconds=2), kill_grace=GRACE)
        assert result.outcome is Outcome.SUCCEEDED, result
        # What the leader left behind in its group is swept when it exits.
        assert await _wait_until_gone([await _read_pid(tmp_path / "childpid")]) == []
    finally:
        _kill_leftovers(tmp_path)


# -- python --------------------------------------------------------------------------------


async def test_async_python_job_gets_the_run_context() -> None:
    result = await run_python(PythonSpec("tests.unit.jobfuncs:async_job"), CTX, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    assert list(jobfuncs.SEEN) == [("async", CTX)]


async def test_sync_python_job_runs_in_a_child_with_the_job_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child is told its run (context and CLAIMD_RUN_ID) but not claimd's own settings."""
    monkeypatch.setenv("CLAIMD_DATABASE_URL", "postgresql://claimd:hunter2-secret@db/claimd")
    result = await run_python(PythonSpec("tests.unit.jobfuncs:sync_job"), CTX, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    assert jobfuncs.SEEN == []  # it ran in another process
    assert result.output_tail is not None
    lines = result.output_tail.splitlines()
    assert f"sync {CTX.run_id} 2 7 {CTX.scheduled_at.isoformat()}" in lines
    assert f"env {CTX.run_id} None" in lines


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        (
            "tests.unit.jobfuncs:talking_job",
            "INFO talking job={job} run_id={run_id}: logged at info",
        ),
        (
            "tests.unit.jobfuncs:talking_async_job",
            "WARNING talking job={job} run_id={run_id}: logged at warning",
        ),
    ],
)
async def test_python_job_output_is_kept(target: str, logged: str) -> None:
    """Printed, stderr and logging lines are the attempt's output tail."""
    result = await run_python(PythonSpec(target), CTX, TIMEOUT)
    assert result.outcome is Outcome.SUCCEEDED, result
    assert result.output_tail is not None
    lines = result.output_tail.splitlines()
    assert "printed by attempt 2" in lines
    assert "to stderr" in lines
    assert logged.format(job=CTX.job, run_id=CTX.run_id) in lines  # the run named (issue 25)


async def test_sync_python_timeout_kills_the_child_before_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict comes only once the child is dead: a retry cannot overlap it."""
    monkeypatch.setenv("JOBFUNCS_PID_FILE", str(tmp_path / "pid"))
    executor = LocalExecutor()
    executor.python.kill_grace = GRACE
    async with asyncio.timeout(30):
        result = await executor.execute(
            PythonSpec("tests.unit.jobfuncs:sleeping_job"), CTX, timedelta(seconds=3)
        )
    assert result.outcome is Outcome.TIMED_OUT, result
    pid = _pid_in(tmp_path / "pid")
    assert pid is not None, result
    assert _gone(pid)  # already reaped when the verdict was handed back: no waiting here
    assert result.output_tail is not None
    assert "about to sleep" in result.output_tail


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("tests.unit.jobfuncs:failing_job", "RuntimeError('export for nightly-export broke')"),
        ("tests.unit.jobfuncs:failing_async_job", "ValueError('bad input for attempt 2')"),
    ],
)
async def test_python_exception_fails_the_run_with_the_error(target: str, words: str) -> None:
    result = await run_python(PythonSpec(target), CTX, TIMEOUT)
    assert result.outcome is Outcome.FAILED
    assert result.error == words
    assert result.output_tail is not None
    assert "Traceback" in result.output_tail
    assert target.rpartition(":")[2] in result.output_tail  # the failing function is named


async def test_async_python_timeout() -> None:
    result = await run_python(
        PythonSpec("tests.unit.jobfuncs:slow_async_job"), CTX, timedelta(milliseconds=200)
    )
    assert result.outcome is Outcome.TIMED_OUT
    assert result.error == "timed out after 0:00:00.200000"
    assert [kind for kind, _ in jobfuncs.SEEN] == ["slow-start"]  # cancelled, never finished


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("tests.unit.no_such_module:job", "cannot load tests.unit.no_such_module:job"),
        ("tests.unit.jobfuncs:no_such_function", "no_such_function"),
        ("tests.unit.jobfuncs:NOT_CALLABLE", "is not callable"),
    ],
)
async def test_python_target_that_cannot_load_fails(target: str, words: str) -> None:
    result = await run_python(PythonSpec(target), CTX, TIMEOUT)
    assert result.outcome is Outcome.FAILED
    assert result.error is not None
    assert words in result.error


async def test_local_executor_dispatches_on_the_spec() -> None:
    executor = LocalExecutor()
    shell = await executor.execute(ShellSpec(argv=("/bin/sh", "-c", "exit 4")), CTX, TIMEOUT)
    assert (shell.outcome, shell.exit_code) == (Outcome.FAILED, 4)
    python = await executor.execute(PythonSpec("tests.unit.jobfuncs:async_job"), CTX, TIMEOUT)
    assert python.outcome is Outcome.SUCCEEDED
    assert list(jobfuncs.SEEN) == [("async", CTX)]


async def test_a_herd_of_sync_python_runs_all_get_their_verdict() -> None:
    """More requests at once than the fork server's socket buffers: each is sent in
    turn, none is stranded waiting for a buffer that drained for another."""
    executor = LocalExecutor()

    async def one(i: int) -> Outcome:
        context = RunContext(f"run-{i}", "herd", CTX.scheduled_at, 1, 1)
        result = await executor.execute(PythonSpec("bench.common:noop"), context, TIMEOUT)
        return result.outcome

    async with asyncio.timeout(120):
        outcomes = await asyncio.gather(*(one(i) for i in range(300)))
    assert set(outcomes) == {Outcome.SUCCEEDED}


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps orphans here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_a_fork_server_killed_mid_run_takes_its_child_along_and_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run fails (it does not hang), its child does not run on, the next run works."""
    monkeypatch.setenv("JOBFUNCS_PID_FILE", str(tmp_path / "pid"))
    executor = LocalExecutor()
    running = asyncio.ensure_future(
        executor.execute(PythonSpec("tests.unit.jobfuncs:sleeping_job"), CTX, TIMEOUT)
    )
    child = await _read_pid(tmp_path / "pid")
    server = executor.python.children._proc
    assert server is not None
    os.kill(server.pid, signal.SIGKILL)
    async with asyncio.timeout(30):
        result = await running
    assert result.outcome is Outcome.FAILED
    assert result.error is not None
    assert "fork server ended" in result.error
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while _running(child) and loop.time() < end:
        await asyncio.sleep(0.05)
    assert not _running(child)
    async with asyncio.timeout(60):
        again = await executor.execute(PythonSpec("tests.unit.jobfuncs:sync_job"), CTX, TIMEOUT)
    assert again.outcome is Outcome.SUCCEEDED, again

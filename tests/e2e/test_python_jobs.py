"""Jobs declared in Python (``@claimd.job``), through the real `claimd` command.

A module beside the config file declares three jobs (sync, async, and one with a
bad cron): `claimd check-config` lists the two with their fire times and rejects
the third naming ``module:function`` and the field; `claimd run` executes the two
(each execution leaves a line in a file) and a reload after an edit of the module
applies its new decorator and its new function body. `check-config` also refuses a
name given both in the file and in code, a module that cannot be imported (its
jobs alone) and a ``python = "nosuch:fn"`` target, and imports in a child process
with a deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.adapters.embedded import free_port
from tests.e2e.helpers import ClaimdProcess, eventually, write_config
from tests.e2e.test_cli import (
    EXIT_MARGIN_S,
    GRACE_S,
    dev_session,
    run_config,
    short_data_dir,
    spawn,
    stop_embedded_postgres,
    succeeded_runs,
)
from tests.e2e.test_config_rejected import rejected_lines
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]
__all__ = ["spawn"]  # the fixture, shared with test_cli

MODULE = """
import claimd

EFFECTS = {effects!r}


def _effect(ctx, version):
    with open(EFFECTS, "a") as out:
        out.write(f"{{ctx.job}} {{ctx.run_id}} {{ctx.scheduled_at.isoformat()}} {{version}}\\n")


@claimd.job(every="1s", timeout="10s")
def tick_sync(ctx):
    _effect(ctx, "v1")


@claimd.job(every="1s", timeout="10s", overlap="forbid")
async def tick_async(ctx):
    _effect(ctx, "v1")


@claimd.job(cron="61 * * * *")
def broken(ctx):
    pass
"""


def declaring_module(folder: Path, effects: Path, name: str = "billing_jobs") -> Path:
    path = folder / f"{name}.py"
    path.write_text(MODULE.format(effects=str(effects)), "utf-8")
    return path


def errors_of(process: ClaimdProcess) -> list[str]:
    return [line for line in process.stderr().splitlines() if line.startswith("error:")]


async def test_check_config_lists_the_declared_jobs_and_rejects_the_bad_one(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    folder = tmp_path / "conf"  # the module beside the config, not in the working directory
    folder.mkdir()
    declaring_module(folder, tmp_path / "effects.txt")
    path = write_config(folder / "claimd.toml", jobs="", modules=["billing_jobs"])  # type: ignore[arg-type]
    checker = spawn("check-config", str(path), "--count", "2")
    assert await checker.wait(60) == 2, checker.stderr()
    out = checker.stdout()
    assert "tick_sync: every 1s" in out, out
    assert "tick_async: every 1s" in out, out
    assert len([line for line in out.splitlines() if line.startswith("  ")]) == 4, out
    errors = errors_of(checker)
    assert len(errors) == 1, checker.stderr()
    assert errors[0].startswith("error: billing_jobs:broken: job 'broken': field 'cron': "), errors
    assert not (tmp_path / "effects.txt").exists()  # imported, not run


async def test_check_config_refuses_a_name_twice_a_module_that_fails_and_a_bad_target(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    declaring_module(tmp_path, tmp_path / "effects.txt")
    # Imports, says where it was imported (which process), then fails.
    (tmp_path / "fails_jobs.py").write_text(
        "import os, pathlib, claimd\n"
        f"pathlib.Path({str(tmp_path / 'imported_by')!r}).write_text(str(os.getpid()))\n"
        "@claimd.job(every='1m')\ndef never(ctx): pass\n"
        "raise RuntimeError('no database credentials')\n",
        "utf-8",
    )
    path = write_config(
        tmp_path / "claimd.toml",
        jobs='[jobs.tick_sync]\nevery = "1m"\nrun = { shell = ["/bin/true"] }\n\n'
        '[jobs.ghost]\nevery = "1m"\nrun = { python = "nosuch:fn" }\n\n'
        '[jobs.fine]\nevery = "1m"\nrun = { shell = ["/bin/true"] }\n',
        modules=["billing_jobs", "fails_jobs"],  # type: ignore[arg-type]
    )
    checker = spawn("check-config", str(path), "--count", "1")
    assert await checker.wait(60) == 2, checker.stderr()
    errors = errors_of(checker)
    by_kind = {
        "twice": [e for e in errors if "'tick_sync'" in e],
        "module": [e for e in errors if "fails_jobs" in e],
        "target": [e for e in errors if "'ghost'" in e],
        "cron": [e for e in errors if "billing_jobs:broken" in e],
    }
    assert all(len(found) == 1 for found in by_kind.values()), checker.stderr()
    assert len(errors) == 4, checker.stderr()
    twice = by_kind["twice"][0]
    assert "[jobs.tick_sync]" in twice, twice
    assert "billing_jobs:tick_sync" in twice, twice
    assert str(path) in twice, twice
    module = by_kind["module"][0]
    assert "module 'fails_jobs': field 'claimd.modules'" in module, module
    assert "RuntimeError: no database credentials" in module, module
    target = by_kind["target"][0]
    assert "field 'run.python'" in target, target
    assert "No module named 'nosuch'" in target, target
    # The good ones load: TOML and declared alike.
    out = checker.stdout()
    for name in ("fine", "tick_async"):
        assert f"{name}: every" in out, out
    assert "tick_sync:" not in out, out
    # Imported in a child process: not the checker's own.
    assert int((tmp_path / "imported_by").read_text()) != checker.pid


async def test_check_config_stops_a_module_import_that_hangs(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    (tmp_path / "hangs_jobs.py").write_text("import time\ntime.sleep(3600)\n", "utf-8")
    path = write_config(
        tmp_path / "claimd.toml",
        jobs='[jobs.fine]\nevery = "1m"\nrun = { shell = ["/bin/true"] }\n',
        modules=["hangs_jobs"],  # type: ignore[arg-type]
    )
    checker = spawn("check-config", str(path), "--import-timeout", "2")
    assert await checker.wait(30) == 2, checker.stderr()
    errors = errors_of(checker)
    assert len(errors) == 1, checker.stderr()
    assert "module 'hangs_jobs'" in errors[0], errors
    assert "within 2s" in errors[0], errors
    assert "fine: every" in checker.stdout()


def read_versions(path: Path) -> dict[str, set[str]]:
    """job -> the versions of its function that executed."""
    versions: dict[str, set[str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            job, _, _, version = line.split()
            versions.setdefault(job, set()).add(version)
    return versions


async def test_run_executes_the_declared_jobs_and_a_reload_applies_an_edited_module(
    schema_url: str,
    nats_url: str,
    deployment: str,
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    effects = tmp_path / "effects.txt"
    module = declaring_module(folder, effects)
    failing = folder / "fails_jobs.py"
    failing.write_text("raise ImportError('stripe is not installed')\n", "utf-8")
    config = run_config(
        folder / "claimd.toml",
        schema_url,
        nats_url,
        deployment,
        "",
        modules=["billing_jobs", "fails_jobs"],  # type: ignore[arg-type]
    )
    pid_file = tmp_path / "claimd.pid"
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file))

    async def both_ran_twice() -> bool:
        assert replica.returncode() is None, f"exited early:\n{replica.stderr()[-3000:]}"
        return all([await succeeded_runs(schema_url, j) >= 2 for j in ("tick_sync", "tick_async")])

    await eventually(both_ran_twice, timeout=60, what="two succeeded runs of each declared job")
    skipped = replica.events("invalid job skipped; the others run")
    assert [(e["job"], e["field"], e["path"]) for e in skipped] == [
        ("broken", "cron", "billing_jobs:broken"),
        ("fails_jobs", "claimd.modules", str(config)),
    ]
    # Every execution left its line, each run once.
    assert read_versions(effects) == {"tick_sync": {"v1"}, "tick_async": {"v1"}}
    run_ids = [line.split()[1] for line in effects.read_text().splitlines()]
    assert len(run_ids) == len(set(run_ids))
    # Both refusals are on record, as a bad TOML job's are.
    rejected = rejected_lines((await claimd("jobs", "--database-url", schema_url)).out)
    assert set(rejected) == {"broken", "fails_jobs"}, rejected
    assert "field 'cron'" in rejected["broken"], rejected
    assert "ImportError: stripe is not installed -- not running" in rejected["fails_jobs"]

    # An edit: tick_sync's body changes, broken is fixed and renamed by its decorator.
    text = (
        module.read_text()
        .replace(
            'tick_sync(ctx):\n    _effect(ctx, "v1")', 'tick_sync(ctx):\n    _effect(ctx, "v2")'
        )
        .replace('@claimd.job(cron="61 * * * *")', '@claimd.job(every="1s", name="mended")')
        .replace("broken(ctx):\n    pass", 'broken(ctx):\n    _effect(ctx, "v2")')
    )
    module.write_text(text, "utf-8")
    failing.write_text("", "utf-8")  # mended too: it declares nothing
    reloaded = await claimd(
        "reload", "--database-url", schema_url, "--pid-file", str(pid_file), cwd=tmp_path
    )
    assert reloaded.code == 0, reloaded
    assert "1 added" in reloaded.out, reloaded.out

    async def edit_applied() -> bool:
        assert replica.returncode() is None, f"exited early:\n{replica.stderr()[-3000:]}"
        versions = read_versions(effects)
        return "v2" in versions.get("tick_sync", set()) and "mended" in versions

    await eventually(edit_applied, timeout=45, what="the edited module's jobs to run")
    assert "rejected" not in (await claimd("jobs", "--database-url", schema_url)).out
    replica.terminate()
    assert await replica.wait(GRACE_S + EXIT_MARGIN_S) == 0, replica.stderr()[-3000:]


async def test_dev_runs_the_declared_jobs(
    tmp_path: Path, spawn: Callable[..., ClaimdProcess]
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    effects = tmp_path / "effects.txt"
    declaring_module(folder, effects)
    config = write_config(
        folder / "dev.toml",
        jobs="",
        http="127.0.0.1:0",
        claim_interval="100ms",
        materialize_interval="500ms",
        modules=["billing_jobs"],  # type: ignore[arg-type]
    )
    data_dir = short_data_dir()
    try:
        dev = await dev_session(spawn, data_dir, free_port(), "--config", str(config))
    finally:
        stop_embedded_postgres(data_dir)
    finished = {e["job"] for e in dev.events("run finished") if e["outcome"] == "succeeded"}
    assert finished, dev.stderr()[-3000:]
    assert finished <= {"tick_sync", "tick_async"}, finished
    assert set(read_versions(effects)) <= {"tick_sync", "tick_async"}
    assert finished <= set(read_versions(effects))

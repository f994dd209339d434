"""``@claimd.job``: what the decorator records, and how the loader imports and judges it."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import claimd
from actors.config import CodeImport, ConfigError, load_config, parse_config
from actors.domain import IntervalSchedule, PythonSpec


@pytest.fixture
def module_name(tmp_path: Path) -> Iterator[str]:
    """A module name of the test's own; forgotten (module, declarations, path) afterwards."""
    name = f"jobs_{uuid.uuid4().hex[:8]}"
    yield name
    sys.modules.pop(name, None)
    claimd.forget(name)
    folder = str(tmp_path.resolve())
    while folder in sys.path:
        sys.path.remove(folder)


def config(tmp_path: Path, module: str, jobs: str = "") -> Path:
    path = tmp_path / "claimd.toml"
    path.write_text(f'[claimd]\nmodules = ["{module}"]\n\n{jobs}', "utf-8")
    return path


def test_the_decorator_records_a_plain_table_per_function() -> None:
    make = claimd.job(every=timedelta(seconds=1.5), max_attempts=3)

    def one(ctx: object) -> None: ...

    async def two(ctx: object) -> None: ...

    assert make(one) is one
    make(two)
    claimd.job(cron="0 2 * * *", name="nightly")(one)
    declared = claimd.forget(__name__)
    assert [(d.name, d.keys) for d in declared] == [
        ("one", {"every": "1500ms", "max_attempts": 3, "run": {"python": one_target(one)}}),
        ("two", {"every": "1500ms", "max_attempts": 3, "run": {"python": one_target(two)}}),
        ("nightly", {"cron": "0 2 * * *", "run": {"python": one_target(one)}}),
    ]


def one_target(func: object) -> str:
    return f"{__name__}:{getattr(func, '__qualname__', '')}"


def test_a_declared_job_is_a_job_as_the_file_gives_it(tmp_path: Path, module_name: str) -> None:
    (tmp_path / f"{module_name}.py").write_text(
        "import claimd\n@claimd.job(every='5s', overlap='forbid')\ndef tick(ctx): pass\n"
    )
    loaded = load_config(config(tmp_path, module_name))
    assert loaded.errors == []
    job = loaded.jobs["tick"]
    assert job.executor == PythonSpec(target=f"{module_name}:tick")
    assert job.schedule == IntervalSchedule(timedelta(seconds=5))
    assert job.overlap.value == "forbid"


def test_a_reload_imports_the_module_again_and_applies_the_edit(
    tmp_path: Path, module_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "dont_write_bytecode", False
    )  # as where PYTHONDONTWRITEBYTECODE is unset
    source = tmp_path / f"{module_name}.py"
    source.write_text("import claimd\n@claimd.job(every='5s')\ndef tick(ctx): pass\n")
    path = config(tmp_path, module_name)
    assert load_config(path).jobs["tick"].schedule == IntervalSchedule(timedelta(seconds=5))
    # The same size, within the same second: no stale bytecode is read back.
    source.write_text("import claimd\n@claimd.job(every='7s')\ndef tick(ctx): pass\n")
    # Loaded again without a reload (`claimd dev` reads the file twice at start): as imported.
    assert load_config(path).jobs["tick"].schedule == IntervalSchedule(timedelta(seconds=5))
    reloaded = load_config(path, code=CodeImport(reload=True))
    assert reloaded.jobs["tick"].schedule == IntervalSchedule(timedelta(seconds=7))


def test_a_module_that_breaks_at_a_reload_rejects_the_jobs_it_had_by_name(
    tmp_path: Path, module_name: str
) -> None:
    source = tmp_path / f"{module_name}.py"
    source.write_text("import claimd\n@claimd.job(every='5s')\ndef tick(ctx): pass\n")
    path = config(tmp_path, module_name, '[jobs.other]\nevery = "1m"\nrun = { shell = ["x"] }\n')
    load_config(path)
    source.write_text("import claimd\nraise ImportError('stripe is not installed')\n")
    for _ in range(2):  # and again: what it had declared is remembered
        broken = load_config(path, code=CodeImport(reload=True))
        assert list(broken.jobs) == ["other"]
        assert [(e.job, e.field_name) for e in broken.errors] == [("tick", "claimd.modules")]
        assert "ImportError: stripe is not installed" in broken.errors[0].message


def test_a_module_that_never_imported_is_rejected_under_its_name(
    tmp_path: Path, module_name: str
) -> None:
    (tmp_path / f"{module_name}.py").write_text("syntax error here\n")
    loaded = load_config(config(tmp_path, module_name))
    [error] = loaded.errors
    assert (error.job, error.field_name) == (module_name, "claimd.modules")
    assert str(error).startswith(f"{tmp_path / 'claimd.toml'}: module {module_name!r}: ")
    assert "SyntaxError" in str(error)


def test_one_name_declared_twice_in_code_is_one_error_naming_both(
    tmp_path: Path, module_name: str
) -> None:
    (tmp_path / f"{module_name}.py").write_text(
        "import claimd\n"
        "@claimd.job(every='5s', name='x')\ndef a(ctx): pass\n"
        "@claimd.job(every='6s', name='x')\ndef b(ctx): pass\n"
    )
    loaded = load_config(config(tmp_path, module_name))
    assert loaded.jobs == {}
    [error] = loaded.errors
    assert f"{module_name}:a" in str(error)
    assert f"{module_name}:b" in str(error)


def test_a_nested_function_is_refused_naming_run_python(tmp_path: Path, module_name: str) -> None:
    (tmp_path / f"{module_name}.py").write_text(
        "import claimd\ndef outer():\n    @claimd.job(every='5s')\n    def inner(ctx): pass\n"
        "outer()\n"
    )
    [error] = load_config(config(tmp_path, module_name)).errors
    assert (error.job, error.field_name) == ("inner", "run.python")
    assert error.path == f"{module_name}:outer.<locals>.inner"


def test_a_module_name_that_is_not_one_is_a_settings_error(tmp_path: Path) -> None:
    path = tmp_path / "claimd.toml"
    path.write_text('[claimd]\nmodules = ["billing/jobs.py"]\n')
    with pytest.raises(ConfigError, match=r"field 'claimd\.modules.*billing/jobs\.py"):
        load_config(path)


def test_a_python_target_that_does_not_import_rejects_its_job_alone(tmp_path: Path) -> None:
    path = tmp_path / "claimd.toml"
    path.write_text(
        '[jobs.ghost]\nevery = "1m"\nrun = { python = "nosuch_module_x:fn" }\n'
        '[jobs.gone]\nevery = "1m"\nrun = { python = "actors.config.examples:nosuch" }\n'
        '[jobs.fine]\nevery = "1m"\nrun = { python = "actors.config.examples:hello" }\n'
    )
    loaded = load_config(path)
    assert list(loaded.jobs) == ["fine"]
    assert [(e.job, e.field_name) for e in loaded.errors] == [
        ("ghost", "run.python"),
        ("gone", "run.python"),
    ]
    assert "No module named 'nosuch_module_x'" in loaded.errors[0].message
    # The text alone (parse_config without code) imports nothing, as before.
    assert sorted(parse_config(path.read_text(), str(path), env={}).jobs) == [
        "fine",
        "ghost",
        "gone",
    ]

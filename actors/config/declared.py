"""Jobs declared in Python (``@claimd.job``) and the import check of every python target.

The config's ``modules`` are imported (their decorators record plain tables in
the ``claimd`` package) and each declaration becomes a Job through
:func:`job_from_raw`, as a ``[jobs.NAME]`` table does: the same checks, the
errors located at ``module:function`` instead of the file. Every python target,
declared or written in the file, must import and be callable, or its job is
rejected alone (field ``run.python``). A module that cannot be imported rejects
its jobs alone; a name given both in the file and in code, or twice in code,
rejects that name (one line naming both places).

Where the code is imported (:class:`CodeImport`): in this process for ``claimd
run``, ``claimd dev`` and a reload (the worker imports it to run it anyway), or
in a child process with a deadline (``claimd check-config``, the check before
``claimd reload``), whose side effects and hangs stay its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from actors.config.errors import ConfigError
from actors.config.jobs import job_from_raw
from actors.domain import Job, PythonSpec
from claimd._probe import probe

MODULES_FIELD = "claimd.modules"


@dataclass(frozen=True)
class CodeImport:
    """How the python code a config names is imported while the config is loaded."""

    # In a child process (`python -P -m claimd._probe`), killed after ``timeout`` seconds.
    in_child: bool = False
    timeout: float = 30.0
    # In this process: a module imported already is imported again
    # (importlib.reload), so that an edited decorator takes effect.
    reload: bool = False


IN_PROCESS = CodeImport()


class ModuleNotImported(ConfigError):
    """A module of ``modules`` that cannot be imported: its jobs, unknown, are not loaded.

    Recorded among the rejected jobs under the module's name, so that `claimd
    jobs`, the API and the status page show it as they show a rejected job.
    """

    def __init__(self, path: str, module: str, message: str) -> None:
        super().__init__(path, message, field_name=MODULES_FIELD)
        self.job = module
        self.args = (f"{path}: module {module!r}: field {MODULES_FIELD!r}: {message}",)


def _in_child(folder: str | None, modules: list[str], targets: list[str], timeout: float) -> Any:
    request = json.dumps({"folder": folder, "modules": modules, "targets": targets})
    try:
        done = subprocess.run(
            # -P: the working directory is not put on the path (`claimd run` does not either).
            [sys.executable, "-P", "-m", "claimd._probe"],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"importing did not finish within {timeout:g}s (the import check was stopped)"
    except OSError as exc:
        return f"cannot start the import check: {exc}"
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = " ".join(done.stderr.split())[-300:]
        return f"the import check exited with status {done.returncode}: {tail}"


def find_code(
    folder: str | None, modules: list[str], targets: list[str], how: CodeImport
) -> dict[str, Any]:
    """The modules' declarations and the targets' verdicts (see claimd._probe.probe)."""
    if not how.in_child:
        return probe(folder, modules, targets, reload=how.reload)
    found = _in_child(folder, modules, targets, how.timeout)
    if isinstance(found, str):  # the child failed as a whole: every import fails with it
        return {
            "modules": {m: {"error": found, "previous": [], "declared": []} for m in modules},
            "targets": dict.fromkeys(targets, found),
        }
    result: dict[str, Any] = found
    return result


def python_targets(jobs: dict[str, Job]) -> list[str]:
    return sorted({j.executor.target for j in jobs.values() if isinstance(j.executor, PythonSpec)})


def _declared_jobs(
    path: str, modules: list[str], found: dict[str, Any]
) -> tuple[dict[str, list[tuple[str, Job | None]]], list[ConfigError]]:
    """Each declared name -> (module:function, its Job or None when refused); the errors."""
    declared: dict[str, list[tuple[str, Job | None]]] = {}
    errors: list[ConfigError] = []
    for module in modules:
        finding = found["modules"][module]
        if finding["error"] is not None:
            if not finding["previous"]:
                errors.append(ModuleNotImported(path, module, finding["error"]))
            for name in finding["previous"]:  # known from its last import: each is rejected
                errors.append(
                    ConfigError(path, finding["error"], job=name, field_name=MODULES_FIELD)
                )
            continue
        for d in finding["declared"]:
            target = f"{d['module']}:{d['function']}"
            job: Job | None = None
            try:
                if d["error"] is not None:
                    raise ConfigError(target, d["error"], job=d["name"], field_name="run.python")
                job = job_from_raw(target, d["name"], d["keys"])
            except ConfigError as exc:
                errors.extend(exc.each())
            declared.setdefault(d["name"], []).append((target, job))
    return declared, errors


def add_python_jobs(
    path: str,
    modules: list[str],
    file_names: set[str],
    jobs: dict[str, Job],
    errors: list[ConfigError],
    found: dict[str, Any],
) -> None:
    """Check the file's python targets, then add the declared jobs (both in place)."""
    for name, job in list(jobs.items()):
        if isinstance(job.executor, PythonSpec):
            problem = found["targets"].get(job.executor.target)
            if problem is not None:
                del jobs[name]
                errors.append(ConfigError(path, problem, job=name, field_name="run.python"))
    declared, declared_errors = _declared_jobs(path, modules, found)
    errors.extend(declared_errors)
    for name, places in declared.items():
        if name in file_names:
            jobs.pop(name, None)
            errors[:] = [e for e in errors if e.job != name]
            errors.append(
                ConfigError(
                    path,
                    f"defined twice: [jobs.{name}] in this file and @claimd.job on "
                    f"{places[0][0]}; rename one (@claimd.job(name=...))",
                    job=name,
                )
            )
        elif len(places) > 1:
            errors[:] = [e for e in errors if e.job != name]
            errors.append(
                ConfigError(
                    path,
                    f"defined twice: @claimd.job on {places[0][0]} and on {places[1][0]}; "
                    "give one another name (@claimd.job(name=...))",
                    job=name,
                )
            )
        elif places[0][1] is not None:
            jobs[name] = places[0][1]

"""Import the modules a config names and check its python targets; what was found, as data.

claimd's config loader calls :func:`probe` in its own process (``claimd run``,
``claimd dev``, a reload: the worker imports the code anyway), and runs this
module as ``python -P -m claimd._probe`` where importing the user's code must
not touch the process that asks (``claimd check-config``, the check before
``claimd reload``): a child with a deadline, its side effects its own. The
request is JSON on stdin, the answer JSON on the child's original stdout; what
the imported code prints goes to stderr.

Standard library only, like the rest of this package: the child starts fast.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

from claimd import declared_in, forget, restore


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def add_to_path(folder: str | None) -> None:
    """Put the config file's folder first on sys.path (as Python does for a script's)."""
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)


def _forget_bytecode(module: ModuleType) -> None:
    """Remove the module's cached bytecode, so that a reload compiles its source again.

    The cache is judged by the source's size and mtime in whole seconds: an edit of
    the same size within the second it was imported would read the old code back.
    """
    source = getattr(module, "__file__", None)
    if source and source.endswith(".py"):
        with contextlib.suppress(OSError, ValueError, NotImplementedError):
            os.remove(importlib.util.cache_from_source(source))


def _import(name: str, reload: bool) -> tuple[str | None, list[str]]:
    """Import (or reload) one module; its error, and the job names it had declared before."""
    before = forget(name) if reload or name not in sys.modules else declared_in(name)
    try:
        if name in sys.modules:
            if reload:
                _forget_bytecode(sys.modules[name])
                importlib.reload(sys.modules[name])
            else:
                restore(name, before)  # imported already: its declarations stand
        else:
            importlib.import_module(name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's failure, reported
        restore(name, before)
        return f"cannot import {name}: {_one_line(exc)}", [d.name for d in before]
    return None, []


def check_target(target: str) -> str | None:
    """Why ``module:function`` cannot be called, or None (its module is imported, not reloaded)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported on the job
        return f"cannot import {module_name}: {_one_line(exc)}"
    if "." in attr or not hasattr(module, attr):
        return f"module {module_name} has no attribute {attr!r} (a job is a module-level function)"
    if not callable(getattr(module, attr)):
        return f"{target} is not callable"
    return None


def probe(
    folder: str | None, modules: list[str], targets: list[str], *, reload: bool = False
) -> dict[str, Any]:
    """Import ``modules`` (``reload``: again, if imported already), then check ``targets``.

    Returns ``{"modules": {name: {"error", "previous", "declared": [...]}},
    "targets": {target: error or None}}``: a declaration is its name, module,
    function, keys and whether its function resolves (``error``).
    """
    add_to_path(folder)
    found: dict[str, Any] = {}
    for name in modules:
        error, previous = _import(name, reload)
        declared = []
        if error is None:
            for d in declared_in(name):
                declared.append(
                    {
                        "name": d.name,
                        "module": d.module,
                        "function": d.function,
                        "keys": d.keys,
                        "error": check_target(d.target),
                    }
                )
        found[name] = {"error": error, "previous": previous, "declared": declared}
    return {"modules": found, "targets": {t: check_target(t) for t in targets}}


def main() -> int:
    request = json.load(sys.stdin)
    answer = os.dup(1)
    # What the imported code prints (Python or C level) goes to stderr, not into the answer.
    os.dup2(2, 1)
    with contextlib.redirect_stdout(sys.stderr):
        found = probe(request["folder"], request["modules"], request["targets"])
    with os.fdopen(answer, "w", encoding="utf-8") as out:
        # A value JSON cannot carry reaches the loader as its repr, which it then refuses.
        json.dump(found, out, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

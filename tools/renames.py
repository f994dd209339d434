"""The half-done renames of issue 25, finished in one pass that can be run again.

Run from the repository's root: ``python tools/renames.py`` (``--check`` only
says what it would change and exits 1 if anything is left). Each step is
idempotent: after it has run once the old names are gone and it changes
nothing, so it can be run again after a merge brought an old name back.

What and why:

- Only ``actors/adapters/`` is called adapters (the code that knows drivers).
  The replica's bundle of ports was the ``Adapters`` protocol and its
  implementations ``ProductionAdapters``, ``MemoryAdapters``,
  ``BrokenAdapters`` (tests/chaos): now ``PortBundle``, ``ProductionPorts``,
  ``MemoryPorts``, ``BrokenPorts``; the Replica's field and the wiring's
  ``adapters`` are its ``bundle``.
- ``UntilDue``: the module became ``worker/claimed_ahead.py`` but its class
  kept the old name; it is ``ClaimedAhead``.
- ``actors/operator_root.py`` stood alone at the package's root: it is the
  composition root of the operator's commands and only ``actors.cli.main``
  imports it, so it lives in the cli room as ``actors/cli/operator_store.py``.
- ``quietly()`` in ``worker/holding.py`` was a second copy of the inbox
  adapter's ``settle_quietly``: one function, ``settle_quietly``, beside the
  ``Delivery`` port it settles (``actors/ports/dispatch.py``), used by both.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Whole identifiers, everywhere (code and prose).
IDENTIFIERS = {
    "ProductionAdapters": "ProductionPorts",
    "MemoryAdapters": "MemoryPorts",
    "BrokenAdapters": "BrokenPorts",
    "Adapters": "PortBundle",
    "UntilDue": "ClaimedAhead",
    "actors.operator_root": "actors.cli.operator_store",
    "actors/operator_root.py": "actors/cli/operator_store.py",
}
# The lower-case ``adapters`` that named the bundle in code: a variable, a field
# or a keyword argument (never the package ``actors.adapters`` nor prose).
BUNDLE_IN_CODE = re.compile(
    r"(?<!actors\.)(?<![\w/-])adapters\b(?!/)(?=\s*[=.,)]|: [A-Z])"
    r"|(?<=self\.|orts\.)adapters\b"
)
BUNDLE_FILES = (
    "actors/replica/replica.py",
    "actors/replica/wiring.py",
    "tests/chaos/broken_replica.py",
    "tests/unit/test_operator_in_memory.py",
    "tests/unit/test_replica_in_memory.py",
    "tests/unit/test_start_sync_retry.py",
)
KEEP = ("actors/adapters/__init__.py",)
MOVES = {
    "actors/operator_root.py": "actors/cli/operator_store.py",
    "tests/unit/test_until_due.py": "tests/unit/test_claimed_ahead.py",
}
# quietly -> settle_quietly (actors.ports); the worker's own copy removed.
QUIETLY = re.compile(r"(?<![\w.])quietly\(")
QUIETLY_DEF = re.compile(
    r"\n\nasync def quietly\(reply: Awaitable\[object\]\) -> None:\n(?:    .*\n|\n(?=    ))*"
)


def tracked() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "actors", "tests", "bench", "docs", "README.md", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / n for n in names if n.endswith((".py", ".md", ".toml")) and (ROOT / n).exists()]


def rename_identifiers(text: str) -> str:
    for old, new in IDENTIFIERS.items():
        text = re.sub(rf"(?<![\w]){re.escape(old)}(?![\w])", new, text)
    return text


def finish_quietly(path: Path, text: str) -> str:
    rel = path.relative_to(ROOT).as_posix()
    if not rel.startswith("actors/worker/"):
        return text
    text = QUIETLY_DEF.sub("\n", text)

    # the import: drop quietly from holding's names, import settle_quietly from the ports
    def drop(match: re.Match[str]) -> str:
        names = [n.strip() for n in match.group(1).split(",") if n.strip() != "quietly"]
        return f"from actors.worker.holding import {', '.join(names)}"

    if re.search(r"from actors\.worker\.holding import [^\n]*\bquietly\b", text):
        text = re.sub(r"from actors\.worker\.holding import ([^\n]*)", drop, text)
        text = text.replace(
            "from actors.worker.holding import",
            "from actors.ports import settle_quietly\nfrom actors.worker.holding import",
            1,
        )
    return QUIETLY.sub("settle_quietly(", text)


def main(check: bool) -> int:
    changed: list[str] = []
    for old, new in MOVES.items():
        if (ROOT / old).exists() and not (ROOT / new).exists():
            changed.append(f"{old} -> {new}")
            if not check:
                subprocess.run(["git", "mv", old, new], cwd=ROOT, check=True)
    for path in tracked():
        if path.resolve() == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        # The one place "Adapters" means actors/adapters/ itself.
        new = text if path.relative_to(ROOT).as_posix() in KEEP else rename_identifiers(text)
        if path.relative_to(ROOT).as_posix() in BUNDLE_FILES:
            new = BUNDLE_IN_CODE.sub("bundle", new)
        new = finish_quietly(path, new)
        if new != text:
            changed.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(new, encoding="utf-8")
    for line in changed:
        print(("would change " if check else "changed ") + line)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))

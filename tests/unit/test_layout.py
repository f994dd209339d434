"""docs/layout.md is the map of actors/: every module named in its room's row, no row naming a
module that is not there.

A module is named when the row of its room (``domain/``, ``cli/`` ...; the
section's opening paragraph for a module at the package's root) holds, in
backticks, its file name, its path inside the room or a suffix of it
(``operator/commands.py``), or a pattern that matches one of those
(``memory_*.py``, ``statements/*.py``). Adding a module without its words in
the map fails here, and so does a row that points at a file that moved.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "actors"
LAYOUT = ROOT / "docs" / "layout.md"


def _section() -> tuple[str, dict[str, str]]:
    """The section's opening text (the root's modules) and each room's row, by room."""
    text = LAYOUT.read_text(encoding="utf-8")
    section = text.split("## `actors/`", 1)[1].split("\n## ", 1)[0]
    intro, table = section.split("| room |", 1)
    rows = {}
    for line in table.splitlines():
        match = re.match(r"\| `([^`]+/)` \|", line)
        if match:
            rows[match.group(1)] = line
    return intro, rows


def _place(module: Path) -> tuple[str, str]:
    """The module's room (``""`` at the root) and its path inside the room."""
    parts = module.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "", parts[0]
    return parts[0] + "/", "/".join(parts[1:])


def _names(rel: str, token: str) -> bool:
    suffixes = ["/".join(rel.split("/")[i:]) for i in range(rel.count("/") + 1)]
    if any(c in token for c in "*?["):
        return any(fnmatch.fnmatchcase(s, token) for s in suffixes)
    return token in suffixes


def unnamed(modules: list[Path]) -> list[str]:
    """The modules the map does not name, as paths under actors/."""
    intro, rows = _section()
    missing = []
    for module in modules:
        room, rel = _place(module)
        text = intro if not room else rows.get(room, "")
        tokens = re.findall(r"`([^`\s]+)`", text)
        if not any(_names(rel, token) for token in tokens):
            missing.append(module.relative_to(PACKAGE).as_posix())
    return missing


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")


def test_every_module_of_actors_is_named_in_docs_layout() -> None:
    missing = unnamed(_modules())
    assert not missing, (
        f"modules not named in docs/layout.md (add them to their room's row): {missing}"
    )


def test_a_module_without_a_row_is_found() -> None:
    """The check has teeth: a module the map does not know of is reported."""
    ghost = PACKAGE / "domain" / "not_in_the_map.py"
    assert unnamed([ghost]) == ["domain/not_in_the_map.py"]
    assert unnamed([PACKAGE / "not_in_the_map.py"]) == ["not_in_the_map.py"]


def test_every_module_a_row_names_exists_in_its_room() -> None:
    """A row that points at a file: the file is in that room (or named from actors/)."""
    intro, rows = _section()
    wrong = []
    for room, line in rows.items():
        where = PACKAGE / room
        assert where.is_dir(), f"docs/layout.md has a row for {room}, which is not in actors/"
        for token in re.findall(r"`([^`\s]+\.py)`", line):
            if any(c in token for c in "*?[<"):
                continue
            here = [p for p in where.rglob(Path(token).name) if p.as_posix().endswith(token)]
            if not here and not (PACKAGE / token).is_file():
                wrong.append(f"{room}: {token}")
    for token in re.findall(r"`([^`\s/]+\.py)`", intro):
        if not any(c in token for c in "*?[<") and not (PACKAGE / token).is_file():
            wrong.append(f"(root): {token}")
    assert not wrong, f"docs/layout.md names files that are not there: {wrong}"

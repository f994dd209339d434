"""Extract our packages' advisories from a snapshot of pypa/advisory-database.

    python requirements/advisories.py GIT_DIR [--rev REV] [--output requirements/advisories.json]

GIT_DIR is a clone (bare or not) of https://github.com/pypa/advisory-database.
Every package named in requirements/*.txt is looked up under vulns/<package>/
(names compared as PEP 503 normalises them); each advisory that is not
withdrawn is written with its id, aliases and, for each affected entry of
that package, its ECOSYSTEM ranges (OSV events: introduced, fixed,
last_affected, limit) and its explicit versions. The output records the
source, commit and commit date of the snapshot, and the packages looked up
(with or without advisories), so that .ci/audit.py can tell a package the
snapshot says nothing against from a package it never looked at.

Needs PyYAML (in requirements/dev.txt) and git. Run it whenever a lock file
gains a package, and to refresh the snapshot (see requirements/README.md).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "https://github.com/pypa/advisory-database"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalise(name: str) -> str:
    """PEP 503: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_packages(folder: Path) -> list[str]:
    """The normalised names pinned in every requirements/*.txt."""
    names = set()
    for lock in sorted(folder.glob("*.txt")):
        for line in lock.read_text().splitlines():
            match = PIN.match(line)
            if match:
                names.add(normalise(match.group(1)))
    return sorted(names)


def git(git_dir: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def entry(advisory: dict[str, Any], package: str) -> dict[str, Any] | None:
    """The advisory as the audit needs it, or None when it does not concern the package."""
    affected = []
    for item in advisory.get("affected", []):
        meta = item.get("package", {})
        if meta.get("ecosystem") != "PyPI" or normalise(str(meta.get("name", ""))) != package:
            continue
        ranges = [
            {
                "type": "ECOSYSTEM",
                "events": [{k: str(v) for k, v in e.items()} for e in r["events"]],
            }
            for r in item.get("ranges", [])
            if r.get("type") == "ECOSYSTEM"
        ]
        versions = [str(v) for v in item.get("versions", [])]
        affected.append({"ranges": ranges, "versions": versions})
    if not affected:
        return None
    return {
        "id": advisory["id"],
        "aliases": sorted(advisory.get("aliases") or []),
        "package": package,
        "modified": str(advisory.get("modified", "")),
        "affected": affected,
    }


def extract(git_dir: Path, rev: str, packages: list[str]) -> dict[str, Any]:
    commit = git(git_dir, "rev-parse", f"{rev}^{{commit}}").strip()
    date = git(git_dir, "show", "-s", "--format=%cI", commit).strip()
    folders = {
        normalise(path.rsplit("/", 1)[-1]): path
        for path in git(git_dir, "ls-tree", "--name-only", commit, "vulns/").splitlines()
    }
    advisories = []
    withdrawn = 0
    for package in packages:
        if package not in folders:
            continue
        listing = git(git_dir, "ls-tree", "--name-only", commit, folders[package] + "/")
        for path in sorted(listing.splitlines()):
            if not path.endswith((".yaml", ".yml")):
                continue
            advisory = yaml.safe_load(git(git_dir, "show", f"{commit}:{path}"))
            if advisory.get("withdrawn"):
                withdrawn += 1
                continue
            found = entry(advisory, package)
            if found is not None:
                advisories.append(found)
    return {
        "source": SOURCE,
        "commit": commit,
        "date": date,
        "withdrawn_skipped": withdrawn,
        "packages": packages,
        "advisories": advisories,
    }


def render(data: dict[str, Any]) -> str:
    """JSON with one advisory a line: small, and a refresh diffs by advisory."""
    head = {key: value for key, value in data.items() if key != "advisories"}
    lines = [json.dumps(head, sort_keys=True)[:-1] + ', "advisories": [']
    rows = [json.dumps(advisory, sort_keys=True) for advisory in data["advisories"]]
    lines += [row + "," for row in rows[:-1]] + rows[-1:]
    return "\n".join([*lines, "]}"]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", type=Path, help="a clone of pypa/advisory-database")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--output", type=Path, default=ROOT / "requirements" / "advisories.json")
    arguments = parser.parse_args()
    data = extract(arguments.git_dir, arguments.rev, locked_packages(ROOT / "requirements"))
    arguments.output.write_text(render(data))
    print(
        f"{arguments.output.name}: {len(data['advisories'])} advisories for "
        f"{len(data['packages'])} packages, {data['commit'][:12]} ({data['date']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""pip-audit against the lock files, else an advisory snapshot: a known vulnerability fails CI.

Run by CI (.ci/run) with the python of a virtualenv that holds pip-audit
(installed from requirements/audit.txt). Each advisory service is tried in
turn (PyPI's, then OSV); the first that audits at least one package gives
the verdict:

- a vulnerability found: its lines, exit 1 (CI fails);
- none: "pip-audit: clean", exit 0;
- no service could audit anything (unreachable, or every package skipped):
  "PIP-AUDIT INCONCLUSIVE" and the reasons, then the offline check below
  gives the verdict.

The offline check reads requirements/advisories.json, an extract of a
snapshot of pypa/advisory-database (OSV format, made by
requirements/advisories.py: every package of requirements/*.txt, its
advisories' ECOSYSTEM ranges and explicit versions). Each locked
name==version is compared with packaging's PEP 440 versions as OSV
specifies (a range's events in version order: introduced opens, fixed
closes at that version, last_affected closes after it; a listed version is
affected). A pin an advisory covers: its lines, exit 1. A locked package the
extract never looked at (the lock gained a package since the refresh), or a
range that cannot be read: exit 1, since it was not audited. Otherwise
"advisory check (...): clean", exit 0, with a warning (not a failure) when
the snapshot is older than STALE_DAYS.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ("requirements/dev.txt", "requirements/build.txt")
SERVICES = ("pypi", "osv")
ADVISORIES = ROOT / "requirements" / "advisories.json"
STALE_DAYS = 90
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def audit(service: str) -> tuple[list[dict[str, Any]] | None, str]:
    """The report's dependencies, or None and why there is none."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip_audit", "--disable-pip", "--progress-spinner", "off"]
        command += ["--vulnerability-service", service, "--format", "json", "--output", str(report)]
        for lock in LOCKS:
            command += ["--requirement", lock]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            return None, f"{service}: no answer within 600 s"
        if not report.exists() or not report.read_text().strip():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"{service}: pip-audit exited {done.returncode}: {last[:300]}"
        return list(json.loads(report.read_text())["dependencies"]), ""


def judge(service: str, dependencies: list[dict[str, Any]]) -> int | None:
    """Exit 1 on a vulnerability, 0 when clean, None when nothing could be audited."""
    audited = [d for d in dependencies if "skip_reason" not in d]
    skipped = len(dependencies) - len(audited)
    if not audited:
        return None
    found = [(d, v) for d in audited for v in d.get("vulns", [])]
    for dependency, vuln in found:
        fixes = ", ".join(vuln.get("fix_versions", [])) or "none yet"
        print(
            f"VULNERABLE {dependency['name']} {dependency['version']}: "
            f"{vuln.get('id')} (fixed in {fixes})"
        )
    if found:
        print(f"pip-audit ({service}): {len(found)} known vulnerabilities in the lock files")
        return 1
    print(
        f"pip-audit ({service}): clean: {len(audited)} packages of {', '.join(LOCKS)} "
        f"audited, {skipped} skipped"
    )
    return 0


def normalise(name: str) -> str:
    """PEP 503: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(texts: list[str]) -> dict[str, str]:
    """Normalised name -> version of every name==version line of the lock files' texts."""
    found = {}
    for text in texts:
        for line in text.splitlines():
            match = PIN.match(line)
            if match:
                found[normalise(match.group(1))] = match.group(2)
    return found


def _order(event: dict[str, str]) -> tuple[int, Version]:
    ((kind, value),) = event.items()
    if kind == "introduced" and value == "0":
        return (0, Version("0"))
    return (1, Version(value))


def in_range(version: Version, events: list[dict[str, str]]) -> bool:
    """OSV's evaluation of one ECOSYSTEM range (limit events are for git ranges: ignored)."""
    affected = False
    for event in sorted(events, key=_order):
        ((kind, value),) = event.items()
        if kind == "introduced" and (value == "0" or version >= Version(value)):
            affected = True
        elif kind == "fixed" and version >= Version(value):
            affected = False  # fixed: this version and later are not affected
        elif kind == "last_affected" and version > Version(value):
            affected = False  # last_affected: that version still is, later ones are not
    return affected


def _same(version: Version, listed: str) -> bool:
    try:
        return Version(listed) == version
    except InvalidVersion:
        return listed == str(version)


def affects(advisory: dict[str, Any], version: str) -> bool:
    """Whether the advisory covers this version (InvalidVersion when a range cannot be read)."""
    parsed = Version(version)
    for item in advisory["affected"]:
        if any(in_range(parsed, r["events"]) for r in item["ranges"]):
            return True
        if any(_same(parsed, listed) for listed in item["versions"]):
            return True
    return False


def offline(data: dict[str, Any], locked: dict[str, str], now: datetime) -> int:
    """The snapshot's verdict on the locked pins: 1 vulnerable or unaudited, 0 clean."""
    snapshot = (
        f"offline snapshot of pypa/advisory-database at {data['commit'][:12]}, {data['date'][:10]}"
    )
    age = (now - datetime.fromisoformat(data["date"])).days
    if age > STALE_DAYS:
        print(
            f"WARNING: the advisory snapshot is {age} days old (more than {STALE_DAYS}): "
            "advisories published since are not considered; refresh it (requirements/README.md)"
        )
    missing = sorted(set(locked) - set(data["packages"]))
    considered = [a for a in data["advisories"] if a["package"] in locked]
    failed = 0
    for advisory in considered:
        version = locked[advisory["package"]]
        try:
            hit = affects(advisory, version)
        except InvalidVersion as error:
            print(f"UNREADABLE {advisory['id']} for {advisory['package']} {version}: {error}")
            failed += 1
            continue
        if hit:
            aliases = ", ".join(advisory["aliases"]) or "no aliases"
            fixed = sorted(
                {
                    e["fixed"]
                    for i in advisory["affected"]
                    for r in i["ranges"]
                    for e in r["events"]
                    if "fixed" in e
                }
            )
            print(
                f"VULNERABLE {advisory['package']} {version}: {advisory['id']} ({aliases}; "
                f"fixed in {', '.join(fixed) or 'none yet'})"
            )
            failed += 1
    if missing:
        print(
            f"NOT AUDITED: {len(missing)} locked packages are not in requirements/advisories.json "
            f"({', '.join(missing)}): refresh it (requirements/README.md)"
        )
        failed += 1
    verdict = "clean" if not failed else "NOT CLEAN"
    print(
        f"advisory check ({snapshot}): {len(locked)} packages, "
        f"{len(considered)} advisories considered: {verdict}"
    )
    return 1 if failed else 0


def main() -> int:
    reasons = []
    for service in SERVICES:
        dependencies, why = audit(service)
        if dependencies is None:
            reasons.append(why)
            continue
        verdict = judge(service, dependencies)
        if verdict is None:
            reasons.append(f"{service}: every one of {len(dependencies)} packages skipped")
            continue
        return verdict
    print("PIP-AUDIT INCONCLUSIVE: no advisory service could audit the lock files here:")
    for reason in reasons:
        print(f"  {reason}")
    print("  falling back to the advisory snapshot in requirements/advisories.json")
    locked = pins([(ROOT / lock).read_text() for lock in LOCKS])
    return offline(json.loads(ADVISORIES.read_text()), locked, datetime.now(UTC))


if __name__ == "__main__":
    sys.exit(main())

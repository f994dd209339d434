"""pip-audit against the lock files: fail on a known vulnerability, never on an unreachable service.

Run by CI (.ci/run) with the python of a virtualenv that holds pip-audit
(installed from requirements/audit.txt). Each advisory service is tried in
turn (PyPI's, then OSV); the first that audits at least one package gives
the verdict:

- a vulnerability found: its lines, exit 1 (CI fails);
- none: "pip-audit: clean", exit 0;
- no service could audit anything (unreachable, or every package skipped):
  "PIP-AUDIT INCONCLUSIVE", the reasons, exit 0: CI goes on and says so
  rather than failing on the network, or passing as if audited.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

LOCKS = ("requirements/dev.txt", "requirements/build.txt")
SERVICES = ("pypi", "osv")


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
    print("  (not failing CI on the network; the audit runs wherever a service is reachable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

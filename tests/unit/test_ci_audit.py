"""CI's audit verdict (.ci/audit.py): a vulnerability fails; an unaudited lock is not clean."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
from packaging.version import Version

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "audit.py"


@pytest.fixture(scope="module")
def audit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_audit", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_known_vulnerability_fails(audit: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    report = [
        {
            "name": "aiohttp",
            "version": "3.9.0",
            "vulns": [{"id": "GHSA-x", "fix_versions": ["3.9.2"]}],
        },
        {"name": "yarl", "version": "1.9.0", "vulns": []},
    ]
    assert audit.judge("osv", report) == 1
    assert "VULNERABLE aiohttp 3.9.0: GHSA-x (fixed in 3.9.2)" in capsys.readouterr().out


def test_clean_and_unaudited_differ(audit: ModuleType) -> None:
    assert audit.judge("osv", [{"name": "yarl", "version": "1.9.0", "vulns": []}]) == 0
    skipped = [{"name": "yarl", "skip_reason": "Dependency not found on PyPI"}]
    assert audit.judge("pypi", skipped) is None  # inconclusive, never "clean"


# The offline fallback: requirements/advisories.json, an extract of a snapshot
# of pypa/advisory-database (made by requirements/advisories.py).


@pytest.fixture(scope="module")
def snapshot(audit: ModuleType) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(audit.ADVISORIES.read_text()))


def _locked(audit: ModuleType) -> dict[str, str]:
    return cast(
        dict[str, str], audit.pins([(audit.ROOT / lock).read_text() for lock in audit.LOCKS])
    )


def _fresh(snapshot: dict[str, Any], days: int = 1) -> datetime:
    return datetime.fromisoformat(snapshot["date"]) + timedelta(days=days)


def _affects(audit: ModuleType, events: list[dict[str, str]], version: str) -> bool:
    return bool(audit.in_range(Version(version), events))


def test_range_events_as_osv_specifies(audit: ModuleType) -> None:
    fixed = [{"introduced": "0"}, {"fixed": "1.2"}]
    assert _affects(audit, fixed, "0.1")
    assert _affects(audit, fixed, "1.2rc1")  # a pre-release of the fix is before it (PEP 440)
    assert not _affects(audit, fixed, "1.2")
    assert not _affects(audit, fixed, "1.10")  # 1.10 > 1.2: versions, not strings
    last = [{"introduced": "1.0"}, {"last_affected": "1.5"}]
    assert not _affects(audit, last, "0.9")
    assert _affects(audit, last, "1.0")
    assert _affects(audit, last, "1.5")  # last_affected: that version still is
    assert not _affects(audit, last, "1.5.1")
    # two windows, events given out of order: evaluated in version order
    windows = [{"fixed": "2.1"}, {"introduced": "2.0"}, {"fixed": "1.2"}, {"introduced": "1.0"}]
    assert _affects(audit, windows, "1.1")
    assert not _affects(audit, windows, "1.5")
    assert _affects(audit, windows, "2.0.5")
    assert not _affects(audit, windows, "2.1")
    assert _affects(audit, [{"introduced": "3.0"}], "9.0")  # no fix yet


def test_explicit_versions_are_affected(audit: ModuleType) -> None:
    advisory = {"affected": [{"ranges": [], "versions": ["1.7", "2.0.post1"]}]}
    assert audit.affects(advisory, "1.7.0")  # the same PEP 440 version
    assert audit.affects(advisory, "2.0.post1")
    assert not audit.affects(advisory, "1.8")


def test_a_real_advisory_flags_an_old_aiohttp(audit: ModuleType, snapshot: dict[str, Any]) -> None:
    advisory = next(a for a in snapshot["advisories"] if a["id"] == "PYSEC-2024-26")
    assert advisory["package"] == "aiohttp"
    assert "CVE-2024-23829" in advisory["aliases"]
    assert audit.affects(advisory, "3.9.0")
    assert audit.affects(advisory, "3.9.2rc0")
    assert not audit.affects(advisory, "3.9.2")
    assert not audit.affects(advisory, _locked(audit)["aiohttp"])


def test_the_lock_files_are_clean_against_the_snapshot(
    audit: ModuleType, snapshot: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    locked = _locked(audit)
    assert len(locked) > 50
    assert audit.offline(snapshot, locked, _fresh(snapshot)) == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out
    considered = sum(1 for a in snapshot["advisories"] if a["package"] in locked)
    assert considered > 20  # aiohttp, urllib3, requests, pip, werkzeug... were looked at
    commit = snapshot["commit"][:12]
    assert out.endswith(
        f"(offline snapshot of pypa/advisory-database at {commit}, {snapshot['date'][:10]}): "
        f"{len(locked)} packages, {considered} advisories considered: clean\n"
    )
    old = dict(locked, aiohttp="3.9.0")
    assert audit.offline(snapshot, old, _fresh(snapshot)) == 1
    out = capsys.readouterr().out
    assert "VULNERABLE aiohttp 3.9.0: PYSEC-2024-26 (CVE-2024-23829, GHSA-8qpw-xqxj-h4r2" in out
    assert out.endswith("NOT CLEAN\n")


def test_the_extract_covers_every_locked_package(
    audit: ModuleType, snapshot: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    every = audit.pins([path.read_text() for path in (audit.ROOT / "requirements").glob("*.txt")])
    assert set(every) <= set(snapshot["packages"]), "run requirements/advisories.py"
    locked = dict(_locked(audit), **{"not-in-the-extract": "1.0"})
    assert audit.offline(snapshot, locked, _fresh(snapshot)) == 1  # not audited is not clean
    assert "NOT AUDITED: 1 locked packages" in capsys.readouterr().out


def test_an_old_snapshot_warns_without_failing(
    audit: ModuleType, snapshot: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert audit.offline(snapshot, _locked(audit), _fresh(snapshot, days=91)) == 0
    out = capsys.readouterr().out
    assert "WARNING: the advisory snapshot is 91 days old" in out
    assert out.endswith(": clean\n")


def test_unreachable_services_fall_back_to_the_snapshot(
    audit: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(audit, "audit", lambda service: (None, f"{service}: unreachable"))
    assert audit.main() == 0
    out = capsys.readouterr().out
    assert "PIP-AUDIT INCONCLUSIVE" in out
    assert out.endswith(": clean\n")
    # the same path with a snapshot that has an advisory for the locked urllib3
    data = json.loads(audit.ADVISORIES.read_text())
    pinned = _locked(audit)["urllib3"]
    data["advisories"].append(
        {
            "id": "TEST-1",
            "aliases": [],
            "package": "urllib3",
            "affected": [{"ranges": [], "versions": [pinned]}],
        }
    )
    fake = tmp_path / "advisories.json"
    fake.write_text(json.dumps(data))
    monkeypatch.setattr(audit, "ADVISORIES", fake)
    assert audit.main() == 1
    assert f"VULNERABLE urllib3 {pinned}: TEST-1 (no aliases; fixed in none yet)" in (
        capsys.readouterr().out
    )

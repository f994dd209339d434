"""CI's audit verdict (.ci/audit.py): a vulnerability fails; an unaudited lock is not clean."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

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

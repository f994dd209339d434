"""Where sql/ and config/ live: beside the package in a wheel, at the repo root in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent


def _find(installed: str, source: str) -> Path:
    for candidate in (_PACKAGE / installed, _PACKAGE.parent / source):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"cannot find {source}/ (looked in {_PACKAGE / installed} and {_PACKAGE.parent / source})"
    )


def sql_dir() -> Path:
    """The numbered migrations."""
    return _find("_sql", "sql")


def config_dir() -> Path:
    """The example settings and jobs."""
    return _find("_config", "config")

"""`claimd dev` without the `embedded` extra: one line naming the extra, exit 2.

The container test runs the real thing (an image built without the extra);
this one hides the embedded servers from an install that has them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from actors.adapters import embedded
from actors.cli import main as cli


def _hide_embedded_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "pgserver" else real_find_spec(name, package)

    def no_nats_server() -> str:
        raise embedded.EmbeddedUnavailable("nats-server not found")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(embedded, "nats_server_binary", no_nats_server)


def test_dev_without_the_extra_says_what_to_install_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _hide_embedded_servers(monkeypatch)
    data_dir = tmp_path / "data"

    # cmd_dev, not main(): main() would point the process's logging at capsys's stream.
    args = cli.build_parser().parse_args(["dev", "--data-dir", str(data_dir)])
    assert cli.cmd_dev(args) == 2

    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "claimd[embedded]" in err[0]
    assert "pgserver" in err[0]
    assert "nats-server" in err[0]
    assert not data_dir.exists(), "nothing is started or created before the check"


def test_the_check_passes_where_the_extra_is_installed() -> None:
    # The dev extra includes `embedded`, so the test environment has both.
    embedded.require_embedded()

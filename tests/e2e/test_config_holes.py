"""Small holes in reading a config, through the real `claimd check-config` and `claimd reload`.

A job name ending in a newline is refused (names match whole); TOML nested
thousands deep is one line and exit 2, and a reload of it gets a verdict; a
secret pasted where a variable name belongs is never quoted back.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.helpers import ClaimdProcess, child_env, claimd_command, write_config
from tests.e2e.test_cli import run_config, spawn
from tests.e2e.test_config_rejected import started
from tests.e2e.test_operator_cli import claimd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
__all__ = ["spawn"]  # the fixture, shared with test_cli

DEEP = "[claimd]\nnested = " + "[" * 10_000 + "\n"
PASTED = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*claimd_command(), "check-config", str(path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


def test_a_job_name_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "claimd.toml",
        jobs='[jobs."tick\\n"]\nevery = "1m"\nrun = { shell = ["/bin/true"] }\n',
    )
    checked = check_config(path)
    assert checked.returncode == 2, checked
    errors = [line for line in checked.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, checked.stderr
    assert "job 'tick\\n'" in errors[0], errors
    assert "a job name is" in errors[0], errors


def test_deeply_nested_toml_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(DEEP)
    checked = check_config(path)
    assert checked.returncode == 2, checked.stderr[-2000:]
    assert checked.stderr.count("\n") == 1, checked.stderr[-2000:]
    assert checked.stderr.startswith(f"error: {path}: not valid TOML:"), checked.stderr
    assert "nested too deeply" in checked.stderr


def test_a_secret_where_a_variable_name_belongs_is_not_quoted(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "claimd.toml",
        jobs=f"""
[jobs.pay]
every = "1h"
run = {{ shell = ["/bin/true"], secret_env = {{ STRIPE_KEY = "{PASTED}" }} }}

[jobs.hook]
every = "1h"
run = {{ shell = ["/bin/true"], secret_env = {{ "{PASTED}" = 5 }} }}

[jobs.inherit]
every = "1h"
run = {{ shell = ["/bin/true"], inherit_env = ["HOME", "{PASTED}"] }}
""",
    )
    checked = check_config(path)
    assert checked.returncode == 2, checked
    errors = [line for line in checked.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 3, checked.stderr
    assert PASTED not in checked.stderr + checked.stdout
    by_job = {job: next(e for e in errors if f"job {job!r}" in e) for job in ("pay", "inherit")}
    assert "secret_env: entry 1 holds a value that looks like a secret" in by_job["pay"]
    assert "inherit_env: entry 2 holds a value that looks like a secret" in by_job["inherit"]
    assert any("job 'hook': field 'run.secret_env'" in e for e in errors), errors


async def test_a_reload_of_deeply_nested_toml_gets_a_verdict(
    tmp_path: Path,
    spawn: Callable[..., ClaimdProcess],
    schema_url: str,
    nats_url: str,
    deployment: str,
) -> None:
    config = run_config(
        tmp_path / "claimd.toml",
        schema_url,
        nats_url,
        deployment,
        '[jobs.tick]\nevery = "1h"\nrun = { shell = ["/bin/true"] }\n',
    )
    pid_file = tmp_path / "claimd.pid"
    replica = spawn("run", "--config", str(config), "--pid-file", str(pid_file))
    await started(replica)
    config.write_text(DEEP)
    refused = await claimd("reload", "--database-url", schema_url, "--pid-file", str(pid_file))
    assert refused.code == 1, refused
    assert "nested too deeply" in refused.err, refused
    assert replica.returncode() is None, "the replica died of the reload"


def test_check_config_lists_every_mistake_of_a_job_at_once(tmp_path: Path) -> None:
    """Three mistakes in one job: three error lines in one round, each naming the field."""
    path = write_config(
        tmp_path / "claimd.toml",
        jobs='[jobs.report]\ncron = "61 * * * *"\ntimeout = "soon"\n'
        'backoff = { initial = "x" }\nrun = { shell = ["/bin/true"] }\n',
    )
    checked = check_config(path)
    assert checked.returncode == 2, checked
    errors = [line for line in checked.stderr.splitlines() if line.startswith("error:")]
    fields = [line.split("field ", 1)[1].split(":", 1)[0] for line in errors]
    assert fields == ["'cron'", "'timeout'", "'backoff.initial'"], checked.stderr
    assert all("job 'report'" in line for line in errors), errors

"""A job's environment is what it is given, through the real `claimd run`.

A job that prints its environment (``env``) shows the run's values, its own
``env``, its own secret (masked in what is stored) and the one host variable
it names in ``inherit_env``; never the API token, the database URL and its
password, the NATS credentials, another job's secret or any other variable of
claimd's own environment.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.e2e.helpers import ClaimdProcess, child_env, eventually, query
from tests.e2e.test_cli import run_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

API_TOKEN = "api-token-5d1f0c9e7b2a4e68"
DSN_PASSWORD = "dsn-password-8c2e41"
OWN_SECRET = "own-secret-value-91d3"
OTHER_SECRET = "other-jobs-secret-4b7e"
HOST_ONLY = "host-only-value-2a9f"
NATS_PASSWORD = "nats-password-77aa9c"

JOBS = """
[jobs.printer]
every = "1s"
timeout = "10s"
[jobs.printer.run]
shell = ["env"]
env = { GREETING = "hello" }
secret_env = { OWN_SECRET = "CLAIMD_TEST_PRINTER_SECRET" }
inherit_env = ["CLAIMD_TEST_INHERITED"]

[jobs.other]
every = "1h"
timeout = "10s"
run = { shell = ["/bin/true"], secret_env = { OTHER = "CLAIMD_TEST_OTHER_SECRET" } }
"""


def with_password(url: str, password: str, user: str = "postgres") -> str:
    """A test server's URL with credentials (servers without authentication ignore them)."""
    parts = urlsplit(url)
    given, _, host = parts.netloc.rpartition("@")
    user = given.partition(":")[0] or user
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


async def test_a_job_sees_only_what_it_is_given(
    tmp_path: Path, schema_url: str, nats_url: str, deployment: str
) -> None:
    database_url = with_password(schema_url, DSN_PASSWORD)
    config = run_config(
        tmp_path / "claimd.toml",
        database_url,
        with_password(nats_url, NATS_PASSWORD, user="claimd"),
        deployment,
        JOBS,
        api_token_env="CLAIMD_TEST_API_TOKEN",
    )
    env = child_env(
        CLAIMD_TEST_API_TOKEN=API_TOKEN,
        CLAIMD_TEST_PRINTER_SECRET=OWN_SECRET,
        CLAIMD_TEST_OTHER_SECRET=OTHER_SECRET,
        CLAIMD_TEST_INHERITED="inherited-ok",
        CLAIMD_TEST_HOST_ONLY=HOST_ONLY,
        CLAIMD_DATABASE_URL=database_url,  # the override: claimd's own setting
    )
    replica = ClaimdProcess(["run", "--config", str(config)], tmp_path, "replica", env=env)
    replica.start()
    try:
        tails: list[str] = []

        async def printed() -> bool:
            assert replica.returncode() is None, replica.stderr()[-3000:]
            try:
                rows = await query(
                    schema_url,
                    "SELECT r.output_tail FROM job_runs r JOIN jobs j ON j.id = r.job_id "
                    "WHERE j.name = 'printer' AND r.state = 'succeeded' "
                    "AND r.output_tail IS NOT NULL LIMIT 1",
                )
            except Exception:  # noqa: BLE001 - the schema is not migrated yet
                return False
            tails[:] = [r["output_tail"] for r in rows]
            return bool(tails)

        await eventually(printed, timeout=60, what="a printed environment")
    finally:
        replica.terminate()
        try:
            await replica.wait(30)
        finally:
            replica.kill()
    tail = tails[0]
    variables = dict(line.partition("=")[::2] for line in tail.splitlines() if "=" in line)
    # What it is given.
    assert variables["CLAIMD_JOB"] == "printer"
    assert variables["CLAIMD_RUN_ID"]
    assert variables["GREETING"] == "hello"
    assert variables["CLAIMD_TEST_INHERITED"] == "inherited-ok"
    assert variables["OWN_SECRET"] == "***", "its own secret is masked in the stored tail"
    assert "PATH" in variables
    # Nothing else of claimd's: no setting, token, DSN, other job's secret or host variable.
    given = {"CLAIMD_JOB", "CLAIMD_RUN_ID", "CLAIMD_SCHEDULED_AT", "CLAIMD_ATTEMPT"}
    given |= {"CLAIMD_FENCING_TOKEN", "CLAIMD_PROCESS_TREE", "CLAIMD_TEST_INHERITED"}
    given |= {"GREETING", "OWN_SECRET", "PATH", "HOME", "LANG", "TZ", "PWD", "SHLVL", "_"}
    assert set(variables) - given == set(), f"variables not given: {set(variables) - given}"
    for value in (API_TOKEN, DSN_PASSWORD, NATS_PASSWORD, OTHER_SECRET, HOST_ONLY, OWN_SECRET):
        assert value not in tail

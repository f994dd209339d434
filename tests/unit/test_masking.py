"""One masker of every secret the replica knows, built at config load, over every stored text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors.adapters.executors import OUTPUT_TAIL_BYTES, LocalExecutor
from actors.config import parse_config
from actors.domain import Outcome, PythonSpec, RunContext, ShellSpec
from actors.observability import redact
from actors.observability.secrets import MASKER, Masker, url_secrets

CTX = RunContext(
    run_id="00000000-0000-0000-0000-000000000002",
    job="leaky",
    scheduled_at=datetime(2026, 1, 1, tzinfo=UTC),
    attempt=1,
    fencing_token=1,
)
OTHER = "other-jobs-secret-6e1f9a"


def test_a_secret_cut_at_either_edge_of_a_tail_is_masked() -> None:
    masker = Masker(["sk_live_0123456789abcdef"])
    assert masker.mask_tail("key: sk_live_0123456789abcdef.") == "key: ***."
    # The tail was cut in the middle of the secret: its start ends the text...
    assert masker.mask_tail("...the key is sk_live_0123") == "...the key is ***"
    # ... or its end starts the text (the tail keeps the last bytes).
    assert masker.mask_tail("456789abcdef was printed") == "*** was printed"
    assert masker.mask_tail("nothing to hide") == "nothing to hide"


def test_config_load_knows_every_secret_of_the_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAIMD_TEST_MASK_JOB_SECRET", "job-secret-value-19ab")
    monkeypatch.setenv("CLAIMD_TEST_MASK_HEADER", "header-secret-value-5c2d")
    monkeypatch.setenv("CLAIMD_TEST_MASK_API_TOKEN", "api-token-value-0123456789")
    text = """
[claimd]
database_url = "postgresql://claimd:db%40pass-7f3e@db:5432/claimd"
nats_url = "nats://claimd:nats-pass-2b8c@nats:4222"
api_token_env = "CLAIMD_TEST_MASK_API_TOKEN"

[jobs.a]
every = "1h"
run = { shell = ["/bin/true"], secret_env = { X = "CLAIMD_TEST_MASK_JOB_SECRET" } }

[jobs.b]
every = "1h"
[jobs.b.run.http]
url = "https://h.example/"
secret_headers = { X-Key = "CLAIMD_TEST_MASK_HEADER" }
"""
    parse_config(text, "m.toml", env=None)
    for secret in (
        "job-secret-value-19ab",
        "header-secret-value-5c2d",
        "api-token-value-0123456789",
        "db@pass-7f3e",
        "db%40pass-7f3e",
        "nats-pass-2b8c",
    ):
        assert MASKER.knows(secret), secret
        assert MASKER.mask(f"x {secret} y") == "x *** y"
        assert secret not in redact(f"logged {secret}")


def test_url_secrets_reads_passwords_and_nats_tokens() -> None:
    assert url_secrets("postgresql://u:p%40ss@h/db") == ["p%40ss", "p@ss"]
    assert url_secrets("nats://tok3n-value@h:4222,nats://h2:4222") == ["tok3n-value"] * 2
    assert url_secrets("postgresql://u@h/db") == []


@pytest.mark.parametrize(
    ("target", "words"),
    [
        # In the replica's process: it reads the secret, the masker hides it.
        ("tests.unit.jobfuncs:leaking_async_job", "***"),
        # In a child process: the variable is not even in its environment.
        ("tests.unit.jobfuncs:leaking_job", "KeyError('CLAIMD_TEST_LEAKED_SECRET')"),
    ],
)
async def test_another_jobs_secret_in_a_python_traceback_is_masked(
    monkeypatch: pytest.MonkeyPatch, target: str, words: str
) -> None:
    monkeypatch.setenv("CLAIMD_TEST_LEAKED_SECRET", OTHER)
    parse_config(
        '[jobs.owner]\nevery = "1h"\n'
        'run = { shell = ["/bin/true"], secret_env = { S = "CLAIMD_TEST_LEAKED_SECRET" } }\n',
        "owner.toml",
        env=None,
    )
    result = await LocalExecutor().execute(PythonSpec(target), CTX, timedelta(seconds=10))
    assert result.outcome is Outcome.FAILED
    assert OTHER not in (result.error or "") + (result.output_tail or "")
    assert words in (result.error or "")


async def test_a_secret_split_by_the_tail_edge_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "edge-secret-0123456789abcdef"
    monkeypatch.setenv("CLAIMD_TEST_EDGE_SECRET", secret)
    # The tail keeps the last OUTPUT_TAIL_BYTES: its first bytes are the secret's last ones.
    keep = OUTPUT_TAIL_BYTES - 10
    spec = ShellSpec(
        argv=("/bin/sh", "-c", f'printf "%s" "$S"; head -c {keep} /dev/zero | tr "\\0" "x"'),
        secret_env={"S": "CLAIMD_TEST_EDGE_SECRET"},
    )
    result = await LocalExecutor().execute(spec, CTX, timedelta(seconds=10))
    assert result.outcome is Outcome.SUCCEEDED, result
    tail = result.output_tail or ""
    assert tail.startswith("***x"), tail[:40]
    assert secret[-10:] not in tail

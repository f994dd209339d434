"""Secrets: read from claimd's environment at run time, never stored, scrubbed from output."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from actors.adapters.executors import run_shell
from actors.config import ConfigError, parse_config
from actors.domain import Outcome, RunContext, ShellSpec

CTX = RunContext(
    run_id="00000000-0000-0000-0000-000000000001",
    job="j",
    scheduled_at=datetime(2026, 1, 1, tzinfo=UTC),
    attempt=1,
    fencing_token=1,
)
SECRET = "s3cr3t-value-xyz"


async def test_a_secret_reaches_the_job_but_not_the_recorded_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CLAIMD_TEST_TOKEN_SOURCE", SECRET)
    spec = ShellSpec(
        argv=("/bin/sh", "-c", 'echo "token=$TOKEN"; exit 3'),
        secret_env={"TOKEN": "CLAIMD_TEST_TOKEN_SOURCE"},
    )
    result = await run_shell(spec, CTX, timedelta(seconds=10))
    assert result.outcome is Outcome.FAILED
    assert result.output_tail is not None
    assert "token=***" in result.output_tail  # the job saw a value, the record hides it
    assert SECRET not in (result.output_tail + (result.error or ""))


async def test_a_missing_secret_fails_the_run_naming_the_variable() -> None:
    spec = ShellSpec(argv=("/bin/true",), secret_env={"TOKEN": "CLAIMD_TEST_NOT_SET_ANYWHERE"})
    result = await run_shell(spec, CTX, timedelta(seconds=10))
    assert result.outcome is Outcome.FAILED
    assert "CLAIMD_TEST_NOT_SET_ANYWHERE" in (result.error or "")


def test_the_stored_definition_names_the_variable_never_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MYAPP_TOKEN", SECRET)
    loaded = parse_config(
        """
        [jobs.export]
        every = "1m"
        run = { shell = ["/usr/bin/export"], secret_env = { TOKEN = "MYAPP_TOKEN" } }
    """,
        "claimd.toml",
        env={},
    )
    definition = json.dumps(loaded.jobs["export"].definition())
    assert "MYAPP_TOKEN" in definition
    assert SECRET not in definition


def test_secret_env_must_name_variables() -> None:
    loaded = parse_config(
        """
        [jobs.export]
        every = "1m"
        run = { shell = ["/usr/bin/export"], secret_env = { TOKEN = "not a name" } }
    """,
        "claimd.toml",
        env={},
    )
    assert loaded.jobs == {}
    (error,) = loaded.errors
    assert isinstance(error, ConfigError)
    assert (error.job, error.field_name) == ("export", "run")


async def test_a_secret_header_is_sent_and_scrubbed_from_the_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiohttp import web

    from actors.adapters.executors import run_http
    from actors.domain import HttpSpec

    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=500, text=f"rejected {request.headers['Authorization']}")

    app = web.Application()
    app.router.add_post("/", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    monkeypatch.setenv("CLAIMD_TEST_AUTH_SOURCE", f"Bearer {SECRET}")
    try:
        result = await run_http(
            HttpSpec(
                url=f"http://127.0.0.1:{port}/",
                secret_headers={"Authorization": "CLAIMD_TEST_AUTH_SOURCE"},
            ),
            CTX,
            timedelta(seconds=10),
        )
    finally:
        await runner.cleanup()
    assert seen == [f"Bearer {SECRET}"]
    assert result.outcome is Outcome.FAILED
    assert SECRET not in (result.output_tail or "")
    assert "***" in (result.output_tail or "")

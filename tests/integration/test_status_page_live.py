"""The status page's run detail shows a running run's output live, in headless Chromium.

The job prints a line, then waits for the test to create a file before printing the
next: every line the page shows arrives while the run still runs. Reads need a token
here, so the page's stream carries it (fetch with the bearer header; EventSource
could not). Needs Debian's chromium and Playwright, like test_status_page.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import eventually, running
from tests.integration.test_status_page import FAST, _browser_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(180)]

READ_TOKEN = "a-read-token-for-the-live-page-0123456789"
DEADLINE_MS = 30_000


def _jobs(gate: Path) -> str:
    script = (
        "for i in 1 2 3; do echo line-$i; "
        f'while [ ! -e "{gate}/go-$i" ]; do sleep 0.02; done; done; echo all-done'
    )
    return (
        '[jobs.stepped]\ncron = "0 0 1 1 *"\ntimeout = "2m"\nmax_attempts = 1\n'
        f"run = {{ shell = {json.dumps(['/bin/sh', '-c', script])} }}\n"
    )


async def test_the_run_detail_shows_output_as_it_is_printed(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async_playwright, executable = _browser_or_skip()
    gate = tmp_path / "gate"
    gate.mkdir()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"viewer {READ_TOKEN} read\n")
    config = make_config(_jobs(gate), api_token_file=str(tokens), **FAST)
    replica = Replica(tmp_path / "claimd.toml", config)
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0) and bool(
                await store.pool.fetchval("SELECT count(*) FROM jobs WHERE name = 'stepped'")
            )

        await eventually(serving, what="the replica's HTTP server and its job")
        run_id = await store.pool.fetchval(
            "INSERT INTO job_runs (job_id, scheduled_at, due_at) "
            "SELECT id, now(), now() FROM jobs WHERE name = 'stepped' RETURNING id::text"
        )

        async def state() -> str:
            found: str = await store.pool.fetchval(
                "SELECT state FROM job_runs WHERE id = $1::uuid", run_id
            )
            return found

        base = f"http://127.0.0.1:{replica.http_port}"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                page = await (await browser.new_context()).new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" else None,
                )
                await page.goto(base)
                await page.evaluate(f"sessionStorage.setItem('claimd.token', '{READ_TOKEN}')")
                errors.clear()  # the first load's 401s, before the token was given
                await page.goto(f"{base}/?refresh=1&job=stepped&run={run_id}")

                async def shows(text: str) -> None:
                    await page.wait_for_function(
                        "(text) => { const pre = document.querySelector("
                        "\"#detail [data-role='live-output']\");"
                        " return pre !== null && pre.textContent.includes(text); }",
                        arg=text,
                        timeout=DEADLINE_MS,
                    )

                await shows("line-1")
                for i in (1, 2):
                    (gate / f"go-{i}").touch()
                    await shows(f"line-{i + 1}")
                    # Shown while the job still waits for the next file: live.
                    assert await state() == "running"
                (gate / "go-3").touch()
                await shows("all-done")
                await page.wait_for_function(
                    "() => document.querySelector(\"#detail [data-role='live-state']\")"
                    ".textContent.includes('ended: succeeded')",
                    timeout=DEADLINE_MS,
                )
                live = await page.text_content("#detail [data-role='live-output']")
                assert live == "line-1\nline-2\nline-3\nall-done\n", live
                assert errors == [], errors
            finally:
                await browser.close()

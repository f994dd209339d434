"""The status page's recent notifications, in headless Chromium against a live replica.

A failing job notifies a receiver that answers 500 (markup in its body, kept in
the attempt's record): the page lists the notification (job, event, sink,
state, attempts, the last answer) and its error, built as text, running nothing.
Needs Debian's chromium and Playwright (see test_status_page.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import eventually, running
from tests.integration.test_status_page import DEADLINE_MS, FAST, _browser_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(120)]


async def test_the_page_shows_the_last_notifications_and_their_errors_as_text(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async_playwright, executable = _browser_or_skip()

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500, text="<b onmouseover=window.pwned=1>down</b>")

    app = web.Application()
    app.router.add_post("/hook", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    jobs = f"""
[notify]
default = ["ops"]
backoff = "100ms"
interval = "200ms"

[notify.ops]
kind = "webhook"
url = "{url}"

[jobs.nightly-export]
every = "2s"
max_attempts = 1
run = {{ shell = ["false"] }}
"""
    replica = Replica(tmp_path / "claimd.toml", make_config(jobs, **FAST))
    try:
        async with running(replica):

            async def serving() -> bool:
                return replica.http_port not in (None, 0)

            await eventually(serving, what="the replica's HTTP server")

            async def tried() -> bool:
                return bool(
                    await store.pool.fetchval(
                        "SELECT count(*) FROM notification_attempts WHERE outcome = 'failed'"
                    )
                )

            await eventually(tried, timeout=30, what="a failed attempt to notify")
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(
                    executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
                )
                try:
                    page = await browser.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    await page.goto(f"http://127.0.0.1:{replica.http_port}/")
                    item = "#notifications li.notification[data-event='failed']"
                    await page.wait_for_selector(item, timeout=DEADLINE_MS)
                    text = await page.inner_text(item)
                    assert "nightly-export" in text
                    assert "failed → ops" in text
                    assert "HTTP 500" in text
                    assert await page.evaluate("window.pwned === undefined")
                    assert errors == []
                finally:
                    await browser.close()
    finally:
        await runner.cleanup()

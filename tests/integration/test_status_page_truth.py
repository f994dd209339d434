"""The status page in headless Chromium says what is true, against a live replica.

Jobs the config file rejected are listed with their error and whether the old
definition keeps running (a new job with a bad cron; a broken edit of a job that
runs, started with it).

Needs Debian's chromium and Playwright (the dev extra), as test_status_page does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig, parse_config
from actors.replica import Replica
from tests.integration.helpers import eventually, running
from tests.integration.test_status_page import DEADLINE_MS, FAST, _browser_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(180)]

GOOD = """
[jobs.tick]
every = "2s"
run = { python = "actors.config.examples:hello" }

[jobs.nightly]
cron = "0 2 * * *"
run = { python = "actors.config.examples:hello" }
"""
BROKEN = """
[jobs.tick]
every = "2s"
run = { python = "actors.config.examples:hello" }

[jobs.nightly]
cron = "0 25 * * *"
run = { python = "actors.config.examples:hello" }

[jobs.newbad]
cron = "61 * * * *"
run = { python = "actors.config.examples:hello" }
"""


async def test_the_page_lists_the_jobs_the_config_file_rejected(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async_playwright, executable = _browser_or_skip()
    # nightly ran before with a good definition; the file now breaks it.
    await store.sync_jobs(list(parse_config(GOOD, "good.toml", env={}).jobs.values()))
    replica = Replica(tmp_path / "claimd.toml", make_config(BROKEN, **FAST))
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, what="the replica's HTTP server")
        base = f"http://127.0.0.1:{replica.http_port}"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                await page.goto(f"{base}/?refresh=1")
                await page.wait_for_selector(
                    "#rejected li[data-job='newbad']", state="visible", timeout=DEADLINE_MS
                )
                listed = await page.eval_on_selector_all(
                    "#rejected li",
                    """ls => ls.map(l => [l.dataset.job,
                        l.querySelector("[data-role='rejected-verdict']").textContent,
                        l.querySelector("[data-role='rejected-error']").textContent])""",
                )
                assert [(job, verdict) for job, verdict, _ in listed] == [
                    ("newbad", "not running"),
                    ("nightly", "the old definition keeps running"),
                ], listed
                assert all("field 'cron'" in error for _, _, error in listed), listed
                badge = await page.text_content(
                    "#jobs tr.job-row[data-job='nightly'] [data-role='edit-rejected']"
                )
                assert badge == "edit rejected"
            finally:
                await browser.close()

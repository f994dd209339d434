"""The status page at / in headless Chromium, against a live replica on PostgreSQL and NATS.

A succeeding job and an always-failing one: the page shows both, the failing one
with red cells and its error (escaped: markup in the error stays text), the grid
grows after a new run without a reload, a click opens the run's attempts, and at
390x844 nothing overflows sideways. Desktop and phone screenshots are saved to
CLAIMD_SCREENSHOT_DIR (else the test's tmp dir) and their paths printed.

Needs Debian's chromium (/usr/bin/chromium) and Playwright for Python (the dev
extra); it never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig
from actors.replica import Replica
from tests.integration.helpers import eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(180)]

CHROMIUM = os.environ.get("CLAIMD_CHROMIUM", "/usr/bin/chromium")
# Markup in the output and error: the page must show it as text, never build it.
FAILING = "<img src=x onerror=window.pwned=1> disk full"
JOBS = f"""
[jobs.heartbeat]
every = "2s"
run = {{ python = "actors.config.examples:hello" }}

[jobs.nightly-export]
every = "2s"
max_attempts = 1
run = {{ shell = ["sh", "-c", "echo '{FAILING}'; echo 'export failed' >&2; exit 3"] }}

[jobs.backup]
cron = "* * * * *"
run = {{ python = "actors.config.examples:hello" }}
"""
FAST = {"http": "127.0.0.1:0", "claim_interval": "50ms", "materialize_interval": "200ms"}
DEADLINE_MS = 30_000


def _browser_or_skip() -> tuple[Any, str]:
    """Playwright's entry point and the chromium to drive, or a skip saying what is missing."""
    executable = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if executable is None:
        pytest.skip(f"chromium is not installed ({CHROMIUM}; Debian: apt-get install chromium)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install '.[dev]')")
    return async_playwright, executable


async def _backup_history(store: PostgresRunStore) -> None:
    """Give the per-minute job 25 minutes of past: a failure, a skip and a hole.

    The job is moved back to have existed 25 minutes (after its first plan, so
    the materializer plans nothing for the past), and rows are written for every
    past minute but one: the grid must show that one missing, as the audit does.
    """

    async def planned() -> bool:
        return bool(
            await store.pool.fetchval(
                "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE j.name = 'backup'"
            )
        )

    await eventually(planned, what="the first plan of the per-minute job")
    minute = await store.pool.fetchval("SELECT date_trunc('minute', now())")
    await store.pool.execute(
        "UPDATE jobs SET created_at = $1 WHERE name = 'backup'", minute - timedelta(minutes=24)
    )
    for k in range(25):
        if k == 6:
            continue  # deleted by hand, say: no row and no recorded reason
        state, error = {
            9: ("failed", "pg_dump: connection refused"),
            15: ("skipped", "missed its starting deadline (5m)"),
        }.get(k, ("succeeded", None))
        at = minute - timedelta(minutes=k)
        await store.pool.execute(
            """INSERT INTO job_runs (job_id, scheduled_at, due_at, state, started_at,
                                     finished_at, outcome, error)
               SELECT id, t, t, $3, t + interval '1 second', t + interval '3 seconds', $3, $4
                 FROM jobs, (SELECT $2::timestamptz) AS i(t) WHERE name = $1
               ON CONFLICT (job_id, scheduled_at) DO NOTHING""",
            "backup",
            at,
            state,
            error,
        )


def _screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("CLAIMD_SCREENSHOT_DIR")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def test_status_page_in_headless_chromium(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async_playwright, executable = _browser_or_skip()
    shots = _screenshot_dir(tmp_path)
    replica = Replica(tmp_path / "claimd.toml", make_config(JOBS, **FAST))
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, what="the replica's HTTP server")

        async def both_ran() -> bool:
            done = await store.pool.fetch(
                "SELECT DISTINCT j.name FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE r.state IN ('succeeded', 'failed')"
            )
            return len(done) == 2

        await eventually(both_ran, timeout=30, what="a finished run of each job")
        await _backup_history(store)
        base = f"http://127.0.0.1:{replica.http_port}"

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                await _desktop(browser, base, shots)
                await _phone(browser, base, shots)
            finally:
                await browser.close()


async def _desktop(browser: Any, base: str, shots: Path) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    navigations: list[str] = []
    page.on(
        "framenavigated",
        lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
    )
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    # Each job's detail open (the table lists the jobs; ?job= opens one's card and grid).
    await page.goto(f"{base}/?refresh=1&job=backup&job=heartbeat&job=nightly-export")
    # The config's jobs, each with its grid.
    await page.wait_for_selector(
        "article.job[data-job='heartbeat'] button.cell", timeout=DEADLINE_MS
    )
    await page.wait_for_selector(
        "article.job[data-job='nightly-export'] button.cell", timeout=DEADLINE_MS
    )
    names = await page.eval_on_selector_all("article.job h2", "hs => hs.map(h => h.textContent)")
    assert sorted(names) == ["backup", "heartbeat", "nightly-export"]
    # The failing job heads the table.
    first = await page.eval_on_selector("#jobs tr.job-row", "r => [r.dataset.job, r.dataset.state]")
    assert first == ["nightly-export", "failing"], first
    # Nothing came from anywhere but the replica (no CDN).
    assert all(url.startswith(base) or url.startswith("data:") for url in requests), requests

    # The failing job: red cells, its error on the card, the markup shown as text.
    failing = "article.job[data-job='nightly-export']"
    await page.wait_for_selector(
        f"{failing} button.cell[data-status='failed']", timeout=DEADLINE_MS
    )
    red = await page.eval_on_selector(
        f"{failing} button.cell[data-status='failed']",
        "c => [getComputedStyle(c).backgroundColor, c.title, c.textContent]",
    )
    assert red[0] == "rgb(207, 34, 46)", red  # --bad
    assert "failed" in red[1], red  # colour is not the only signal: the title says it
    assert red[2] == "✗", red  # and so does the glyph
    error = await page.text_content(f"{failing} [data-role='last-error']")
    assert error is not None
    assert "exit status 3" in error, error
    healthy = await page.eval_on_selector_all(
        "article.job[data-job='heartbeat'] button.cell", "cs => cs.map(c => c.dataset.status)"
    )
    assert "succeeded" in healthy, healthy
    assert "failed" not in healthy, healthy
    # "missing" on the page means what it means in `claimd audit`.
    cells = await page.eval_on_selector_all(
        "article.job[data-job='backup'] button.cell",
        "cs => cs.map(c => [c.dataset.at, c.dataset.status])",
    )
    assert [status for _, status in cells].count("missing") == 1, cells
    audit = await page.evaluate(
        """async ([from, to]) => (await (await fetch(
               `/api/jobs/backup/audit?from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}`
           )).json()).entries.map(e => [e.scheduled_at, e.status])""",
        [cells[0][0], cells[-3][0]],
    )
    assert [list(c) for c in cells[:-2]] == audit, (cells, audit)  # the newest may move on
    health = await page.text_content("#health")
    assert health is not None
    assert "PostgreSQL: ok" in health, health
    assert "NATS: ok" in health, health
    counters = await page.text_content("#counters")
    assert counters is not None
    assert "duplicate deliveries skipped" in counters
    assert "fenced completions" in counters

    # The grid grows after a new run, without a reload: mark the window, wait
    # for a succeeded cell newer than the newest one now shown.
    await page.evaluate("window.__sameDocument = true")
    newest = await page.eval_on_selector_all(
        "article.job[data-job='heartbeat'] button.cell[data-status='succeeded']",
        "cs => cs.map(c => c.dataset.at).sort().pop()",
    )
    navigations.clear()
    await page.wait_for_function(
        """newest => [...document.querySelectorAll(
               "article.job[data-job='heartbeat'] button.cell[data-status='succeeded']")]
             .some(c => c.dataset.at > newest)""",
        arg=newest,
        timeout=DEADLINE_MS,
    )
    assert await page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert navigations == [], navigations

    # One click away: the failed run's attempts, error and output tail.
    await page.click(f"{failing} button.cell[data-status='failed']")
    await page.wait_for_selector("#detail:not([hidden]) li.attempt", timeout=DEADLINE_MS)
    assert await page.text_content("#detail [data-role='run-state']") == "failed"
    output = await page.text_content("#detail [data-role='output']")
    assert output is not None
    assert FAILING in output, output
    attempts = await page.eval_on_selector_all("#detail li.attempt", "rs => rs.length")
    assert attempts == 1
    # A run with no error: the panel's absent parts are left out, never written as "null".
    await page.click("article.job[data-job='heartbeat'] button.cell[data-status='succeeded']")
    await page.wait_for_function(
        "() => document.querySelector('#detail [data-role=\"run-state\"]')"
        "?.textContent === 'succeeded'",
        timeout=DEADLINE_MS,
    )
    panel = await page.text_content("#detail-body")
    assert panel is not None
    assert "null" not in panel, panel
    await page.click(f"{failing} button.cell[data-status='failed']")
    await page.wait_for_function(
        "() => document.querySelector('#detail [data-role=\"run-state\"]')"
        "?.textContent === 'failed'",
        timeout=DEADLINE_MS,
    )
    assert await page.evaluate("window.pwned === undefined"), "markup from the data ran"
    assert await page.eval_on_selector_all("img", "is => is.length") == 0
    desktop = shots / "status-desktop.png"
    await page.screenshot(path=str(desktop), full_page=True)
    await page.keyboard.press("Escape")
    assert await page.is_hidden("#detail")
    grid_only = shots / "status-desktop-grid.png"
    await page.screenshot(path=str(grid_only), full_page=True)
    assert errors == [], errors
    print(f"\nscreenshot (desktop, run detail open): {desktop}\nscreenshot (desktop): {grid_only}")
    await page.close()


# A phone's width; with is_mobile the page's innerWidth grows to whatever the
# content needs (a phone zooms out), so the width is checked against this.
PHONE_WIDTH = 390


async def _phone(browser: Any, base: str, shots: Path) -> None:
    context = await browser.new_context(
        viewport={"width": PHONE_WIDTH, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    page = await context.new_page()
    # The whole list first: a job's last outcome (a badge with a date) must wrap
    # inside its column, not widen the page.
    await page.goto(f"{base}/?refresh=1")
    await page.wait_for_selector(
        "tr.job-row .badge[class*='look-']:not([hidden])", timeout=DEADLINE_MS
    )
    width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= PHONE_WIDTH, f"the job list overflows sideways at 390 px: {width}"
    await page.goto(f"{base}/?refresh=1&job=nightly-export")
    await page.wait_for_selector(
        "article.job[data-job='nightly-export'] button.cell", timeout=DEADLINE_MS
    )
    width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= PHONE_WIDTH, f"the page overflows sideways at 390 px: {width}"
    phone = shots / "status-phone.png"
    await page.screenshot(path=str(phone), full_page=True)
    await page.tap("article.job[data-job='nightly-export'] button.cell[data-status='failed']")
    await page.wait_for_selector("#detail:not([hidden]) li.attempt", timeout=DEADLINE_MS)
    width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= PHONE_WIDTH, f"the run detail overflows sideways at 390 px: {width}"
    phone_detail = shots / "status-phone-detail.png"
    await page.screenshot(path=str(phone_detail))
    print(f"screenshot (phone 390x844): {phone}\nscreenshot (phone, run detail): {phone_detail}")
    await context.close()


READ_TOKEN = "a-read-token-for-the-page-0123456789"


@asynccontextmanager
async def _page_browser(
    make_config: Callable[..., LoadedConfig], tmp_path: Path, tokens: str
) -> AsyncIterator[tuple[str, Any]]:
    """A replica whose reads need a token (``tokens``: the token file) serving the
    page, and a headless Chromium: (the page's base URL, the browser)."""
    async_playwright, executable = _browser_or_skip()
    token_file = tmp_path / "tokens"
    token_file.write_text(tokens)
    replica = Replica(
        tmp_path / "claimd.toml", make_config(JOBS, api_token_file=str(token_file), **FAST)
    )
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, what="the replica's HTTP server")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                yield f"http://127.0.0.1:{replica.http_port}", browser
            finally:
                await browser.close()


async def test_status_page_asks_for_a_read_token_then_works(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """Reads protected (a token configured): the page shows nothing but a token form,
    refuses a wrong token, then renders with a read token, kept for the tab only
    (sessionStorage: a reload keeps it, a new browser session asks again)."""
    tokens = f"viewer {READ_TOKEN} read\n"
    async with _page_browser(make_config, tmp_path, tokens) as (base, browser):
        context = await browser.new_context()
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{base}/?refresh=1")
        await page.wait_for_selector("#token-form:not([hidden])", timeout=DEADLINE_MS)
        assert await page.eval_on_selector_all("#jobs tr.job-row", "rs => rs.length") == 0
        await page.fill("#token-input", "not-the-token-" + "x" * 20)
        await page.click("#token-submit")
        await page.wait_for_function(
            "() => document.getElementById('token-why').textContent.includes('not accepted')",
            timeout=DEADLINE_MS,
        )
        assert await page.is_visible("#token-form")
        await page.fill("#token-input", READ_TOKEN)
        await page.click("#token-submit")
        await page.wait_for_selector("#jobs tr.job-row[data-job='heartbeat']", timeout=DEADLINE_MS)
        assert await page.is_hidden("#token-form")
        kept = await page.evaluate(
            "[sessionStorage.getItem('claimd.token'), localStorage.length, document.cookie]"
        )
        assert kept == [READ_TOKEN, 0, ""], kept
        # A reload in the same tab keeps it; the page refreshes on its own.
        await page.reload()
        await page.wait_for_selector("#jobs tr.job-row[data-job='heartbeat']", timeout=DEADLINE_MS)
        assert await page.is_hidden("#token-form")
        assert errors == [], errors
        await context.close()
        # Another browser session: asked again.
        other = await browser.new_context()
        fresh = await other.new_page()
        await fresh.goto(base)
        await fresh.wait_for_selector("#token-form:not([hidden])", timeout=DEADLINE_MS)
        await other.close()


OPERATE_TOKEN = "an-operate-token-for-the-page-0123456789"


async def test_the_page_offers_actions_to_an_operate_token_and_links_each_run(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    """With a token the job's detail has buttons (run now, pause or resume): a read
    token is told it may only read, an operate token's action is done and shown;
    each run has a link that opens the page on it."""
    async with _page_browser(
        make_config, tmp_path, f"viewer {READ_TOKEN} read\nops {OPERATE_TOKEN} operate\n"
    ) as (base, browser):
        detail = "article.job[data-job='heartbeat']"
        page = await (await browser.new_context()).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{base}/?refresh=1&job=heartbeat")
        await page.wait_for_selector("#token-form:not([hidden])", timeout=DEADLINE_MS)
        await page.fill("#token-input", READ_TOKEN)
        await page.click("#token-submit")
        await page.click(f"{detail} button[data-action='pause']", timeout=DEADLINE_MS)
        await page.wait_for_function(
            "() => document.querySelector(\"[data-role='action-result']\")"
            ".textContent.includes('may only read')",
            timeout=DEADLINE_MS,
        )
        assert (
            await store.pool.fetchval("SELECT paused FROM jobs WHERE name = 'heartbeat'") is False
        )
        # The operate token: the action is done and the page follows it.
        await page.evaluate(f"sessionStorage.setItem('claimd.token', '{OPERATE_TOKEN}')")
        await page.reload()
        await page.click(f"{detail} button[data-action='pause']", timeout=DEADLINE_MS)
        await page.wait_for_selector(f"{detail} button[data-action='resume']", timeout=DEADLINE_MS)
        assert await store.pool.fetchval("SELECT paused FROM jobs WHERE name = 'heartbeat'") is True
        await page.click(f"{detail} button[data-action='resume']")
        await page.wait_for_selector(f"{detail} button[data-action='pause']", timeout=DEADLINE_MS)
        await page.click(f"{detail} button[data-action='trigger']")
        await page.wait_for_function(
            "() => document.querySelector(\"[data-role='action-result']\")"
            ".textContent.includes('heartbeat')",
            timeout=DEADLINE_MS,
        )
        assert (
            await store.pool.fetchval(
                "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE j.name = 'heartbeat' AND r.trigger = 'manual'"
            )
            == 1
        )

        # A link per run: it opens the page on that run (the manual run, once
        # it has succeeded).
        async def manual_run() -> str | None:
            found: str | None = await store.pool.fetchval(
                "SELECT r.id::text FROM job_runs r JOIN jobs j ON j.id = r.job_id"
                " WHERE j.name = 'heartbeat' AND r.trigger = 'manual'"
                " AND r.state = 'succeeded'"
            )
            return found

        async def manual_run_succeeded() -> bool:
            return await manual_run() is not None

        await eventually(manual_run_succeeded, what="the manual run of heartbeat to succeed")
        run_id = await manual_run()
        await page.goto(f"{base}/?refresh=1&job=heartbeat&run={run_id}")
        await page.wait_for_selector(
            "#detail:not([hidden]) [data-role='run-state']", timeout=DEADLINE_MS
        )
        link = await page.get_attribute("#detail [data-role='run-link']", "href")
        assert link == f"?job=heartbeat&run={run_id}", link
        body = await page.text_content("#detail-body")
        assert body is not None
        assert run_id in body, body
        assert errors == [], errors

"""The status page with 1,000 jobs in headless Chromium, against a live replica.

The generated fleet (tests/integration/many_jobs.py) has a known health: the
summary line must count it right, a failing job must come first, the filters
must narrow the table, a job's grid must be one click away with its instants
and its manual run marked, and a click whose press and release straddle a
refresh must still open the run. Load and refresh are measured in the page
(``performance`` measures the page makes) and printed, never asserted; so are
the API's answers at this size. Desktop (1280x800) and phone (390x844)
screenshots go to CLAIMD_SCREENSHOT_DIR, else the test's tmp dir.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actors.adapters.postgres import PostgresRunStore
from actors.config import LoadedConfig, parse_config
from actors.replica import Replica
from tests.integration import many_jobs
from tests.integration.helpers import eventually, running
from tests.integration.test_status_page import (
    DEADLINE_MS,
    FAST,
    _browser_or_skip,
    _screenshot_dir,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(120)]

TOKEN = "status-page-scale-test-token-0123456789"


# The page keeps the token it was given for the tab (sessionStorage): given before it loads.
SIGNED_IN = f"sessionStorage.setItem('claimd.token', {TOKEN!r})"


async def _api_figures(session: aiohttp.ClientSession, base: str) -> list[str]:
    """How long the page's API answers take at this size (printed, not asserted)."""
    lines = []
    for path in ["/api/jobs", "/api/status", "/api/grid?job=export-0001", "/api/grid"]:
        started = time.monotonic()
        async with session.get(base + path) as response:
            body = await response.read()
            assert response.status == 200, (path, body[:200])
        lines.append(f"  GET {path}: {time.monotonic() - started:.3f} s, {len(body) / 1e6:.2f} MB")
    return lines


async def _measures(page: Any, name: str) -> list[float]:
    return list(
        await page.evaluate("name => performance.getEntriesByName(name).map(m => m.duration)", name)
    )


async def test_status_page_with_1000_jobs(
    make_config: Callable[..., LoadedConfig], store: PostgresRunStore, tmp_path: Path
) -> None:
    async_playwright, executable = _browser_or_skip()
    shots = _screenshot_dir(tmp_path)
    fleet = many_jobs.fleet(await store.pool.fetchval("SELECT now()"))
    # The jobs ran before with good definitions; the file now breaks one and adds two bad ones.
    good = parse_config(many_jobs.config_toml(fleet, broken=False), "good.toml", env={})
    await store.sync_jobs(list(good.jobs.values()))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops {TOKEN}\n")
    config = make_config(
        many_jobs.config_toml(fleet, broken=True), api_token_file=str(tokens), **FAST
    )
    replica = Replica(tmp_path / "claimd.toml", config)
    async with running(replica):

        async def serving() -> bool:
            return replica.http_port not in (None, 0)

        await eventually(serving, timeout=60, what="the replica's HTTP server")
        base = f"http://127.0.0.1:{replica.http_port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}  # reads need the token too
        async with aiohttp.ClientSession(headers=auth) as session:

            async def answering() -> bool:
                async with session.get(f"{base}/api/jobs") as response:
                    return response.status == 200

            await eventually(answering, timeout=60, what="the API with the database")

            async def planned() -> bool:  # history written after it (as in test_status_page)
                return not await store.pool.fetchval(
                    "SELECT count(*) FROM jobs WHERE materialized_until IS NULL"
                )

            await eventually(planned, timeout=60, what="the first plan of every job")
            await many_jobs.write_history(store, fleet)
            for i in range(many_jobs.COUNT):
                if many_jobs.is_paused(i):
                    async with session.post(
                        f"{base}/api/jobs/{many_jobs.name_of(i)}/pause",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    ) as response:
                        assert response.status == 200, await response.text()
            api = await _api_figures(session, base)

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            try:
                figures = await _desktop(browser, base, shots, fleet)
                await _phone(browser, base, shots)
            finally:
                await browser.close()
    print("\nstatus page with 1,000 jobs (headless Chromium):", *figures, *api, sep="\n")


async def _desktop(browser: Any, base: str, shots: Path, fleet: many_jobs.Fleet) -> list[str]:
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.add_init_script(SIGNED_IN)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    started = time.monotonic()
    await page.goto(f"{base}/?refresh=2")
    await page.wait_for_selector("#summary a[data-state='failing']", timeout=DEADLINE_MS)
    shown = time.monotonic() - started

    # The summary line counts every job once, by its state.
    counts = await page.eval_on_selector_all(
        "#summary a.count", "as => as.map(a => [a.dataset.state, Number(a.dataset.count)])"
    )
    expected = fleet.expected()
    # Every state is counted, at zero too (no job of the fleet runs for long: running 0).
    total = {"": many_jobs.COUNT + len(many_jobs.REJECTED_NEW)}
    assert dict(counts) == {**total, "running": 0, **expected}
    rows = await page.eval_on_selector_all(
        "#jobs tr.job-row:not([hidden])", "rs => rs.map(r => [r.dataset.job, r.dataset.state])"
    )
    assert len(rows) == many_jobs.COUNT + len(many_jobs.REJECTED_NEW)
    # Failing first (then by name), then overdue, then rejected.
    assert rows[0] == [fleet.failing_names()[0], "failing"], rows[:3]
    states = [state for _, state in rows]
    assert states[: expected["failing"]] == ["failing"] * expected["failing"]
    assert states[expected["failing"]] == "overdue"

    # A refresh or two, measured by the page itself.
    await page.wait_for_function(
        "() => performance.getEntriesByName('claimd:refresh').length >= 2", timeout=DEADLINE_MS
    )
    load = await _measures(page, "claimd:load")
    refreshes = await _measures(page, "claimd:refresh")
    desktop = shots / "status-1000-desktop.png"
    await page.screenshot(path=str(desktop))

    # The summary's count is a filter; so is the text box.
    await page.click("#summary a[data-state='overdue']")
    await page.wait_for_function(
        "n => document.querySelectorAll('#jobs tr.job-row:not([hidden])').length === n",
        arg=expected["overdue"],
        timeout=DEADLINE_MS,
    )
    assert "state=overdue" in page.url
    await page.select_option("#filter-state", "")
    await page.fill("#filter-text", "export-000")
    visible = await page.eval_on_selector_all(
        "#jobs tr.job-row:not([hidden])", "rs => rs.map(r => r.dataset.job)"
    )
    assert sorted(visible) == sorted(n for n in fleet.names if "export-000" in n), visible

    # A job's detail and grid one click away; the manual run is marked so.
    await page.fill("#filter-text", "billing-0000")
    await page.click("button.job-name[data-job='billing-0000']")
    grid = "article.job[data-job='billing-0000'] button.cell"
    await page.wait_for_selector(grid, timeout=DEADLINE_MS)
    cells = await page.eval_on_selector_all(
        grid, "cs => cs.map(c => [c.dataset.status, c.dataset.trigger, c.title])"
    )
    manual = [c for c in cells if c[1] == "manual"]
    assert len(manual) == 1, cells
    assert "triggered by an operator" in manual[0][2], manual
    assert all(c[2][:4].isdigit() and " UTC: " in c[2] for c in cells), cells
    desktop_detail = shots / "status-1000-desktop-job.png"
    await page.screenshot(path=str(desktop_detail))

    # A click whose press and release straddle a refresh still opens the run.
    await page.locator(f"{grid}[data-trigger='manual']").scroll_into_view_if_needed()
    box = await page.eval_on_selector(
        f"{grid}[data-trigger='manual']",
        "c => { const r = c.getBoundingClientRect();"
        " return [r.x + r.width / 2, r.y + r.height / 2]; }",
    )
    before = len(await _measures(page, "claimd:refresh"))
    await page.mouse.move(*box)
    await page.mouse.down()
    await page.wait_for_function(
        "n => performance.getEntriesByName('claimd:refresh').length > n",
        arg=before,
        timeout=DEADLINE_MS,
    )
    await page.mouse.up()
    await page.wait_for_selector("#detail:not([hidden]) [data-role='run-trigger']", timeout=5000)
    assert await page.text_content("#detail [data-role='run-trigger']") == "manual"
    assert errors == [], errors
    await page.close()
    return [
        f"  first table shown (Playwright, goto to the summary): {shown:.2f} s",
        f"  load (navigation start to the first table painted): {load[0] / 1000:.2f} s",
        "  refresh (fetch, update, paint): " + ", ".join(f"{ms / 1000:.2f} s" for ms in refreshes),
        f"  screenshots: {desktop}, {desktop_detail}",
    ]


async def _phone(browser: Any, base: str, shots: Path) -> None:
    context = await browser.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    await context.add_init_script(SIGNED_IN)
    page = await context.new_page()
    await page.goto(f"{base}/?refresh=2")
    await page.wait_for_selector("#jobs tr.job-row", timeout=DEADLINE_MS)
    width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page overflows sideways at 390 px: {width}"
    phone = shots / "status-1000-phone.png"
    await page.screenshot(path=str(phone))
    print(f"\nscreenshot (phone 390x844, 1,000 jobs): {phone}")
    await context.close()

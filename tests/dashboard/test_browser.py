"""End to end in headless Chromium (Debian's, driven by Playwright), against a proxy filled with
recorded data: pages load, a group's scores and explanations show, the reward plot renders, hostile
trajectory content shows as text and runs nothing, pages follow new data without a reload, and the
admin key is enforced. Screenshots are kept in `artifacts/dashboard/` (ignored by git)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from art_proxy.proxy.server import RunningProxy
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch
from tests.dashboard.conftest import ADMIN_KEY
from tests.dashboard.recorded import IMG, SCRIPT, Recorded, record_everything
from tests.store_rows import call_row, group_row, scenario_row, trajectory_row

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling out, which a closed network
# refuses; --no-sandbox because the tests may run as root.
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"
WAIT_MS = 15_000  # pages poll every 2 s; generous for a loaded machine

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed at /usr/bin/chromium (`make setup` installs it "
    "where apt-get can run as root or through sudo)",
)


@dataclass
class Tab:
    page: Page
    errors: list[str] = field(default_factory=list)  # console errors, CSP refusals included

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def tab(browser: Browser) -> AsyncIterator[Tab]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await context.new_page()
    opened = Tab(page)
    page.on("console", lambda message: _keep_error(opened, message.type, message.text))
    page.on("pageerror", lambda error: opened.errors.append(str(error)))
    try:
        yield opened
    finally:
        await context.close()


def _keep_error(tab: Tab, kind: str, text: str) -> None:
    if kind == "error":
        tab.errors.append(text)


async def expect_hostile_text_inert(page: Page) -> None:
    assert await page.evaluate("() => window.__pwned") is None
    assert await page.locator("main script, main img").count() == 0
    await expect(page.get_by_text(SCRIPT).first).to_be_visible()
    await expect(page.get_by_text(IMG).first).to_be_visible()


async def test_group_page_shows_scores_explanations_and_hostile_text_that_runs_nothing(
    sqlite_proxy: RunningProxy, recorded: Recorded, tab: Tab
) -> None:
    page = tab.page
    response = await page.goto(f"{sqlite_proxy.root_url}/dashboard/groups/{recorded.group_id}")
    assert response is not None and response.status == 200
    columns = page.locator("article.trajectory")
    await expect(columns).to_have_count(2)
    await expect(page.locator(".score-value")).to_have_text(["0.875", "0.250"])
    await expect(columns.nth(0).locator(".explanation")).to_have_text(
        "Reached the goal in two calls."
    )
    await expect(columns.nth(1).locator(".explanation")).to_contain_text(SCRIPT)
    await expect(columns.nth(0).get_by_text("programmatic reward")).to_be_visible()
    await expect(columns.nth(0).locator(".tool-call code").first).to_have_text("lookup")
    await expect_hostile_text_inert(page)
    await tab.screenshot("group")

    await columns.nth(1).locator("h2 a").click()
    await expect(page).to_have_url(f"{sqlite_proxy.root_url}/dashboard/trajectories/evil-1")
    await expect(page.locator("table.calls tbody tr")).to_have_count(2)
    await page.locator("details.raw summary").first.click()
    await expect(page.locator("details.raw pre").first).to_contain_text('"messages"')
    await expect_hostile_text_inert(page)
    await tab.screenshot("trajectory")
    assert tab.errors == []


async def test_training_page_draws_the_reward_curve_with_its_points(
    sqlite_proxy: RunningProxy, recorded: Recorded, tab: Tab
) -> None:
    page = tab.page
    await page.goto(f"{sqlite_proxy.root_url}/dashboard/training")
    reward = page.locator('svg[aria-label="Reward"]')
    await expect(reward.locator("circle.dot")).to_have_count(8)  # mean and validation, 4 steps
    box = await reward.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    means = reward.locator("circle.dot.s0")
    first, last = await means.first.bounding_box(), await means.last.bounding_box()
    assert first is not None and last is not None
    assert last["x"] > first["x"] and last["y"] < first["y"]  # the reward rose, step by step
    await expect(page.locator('svg[aria-label="Loss"] circle.dot')).to_have_count(4)
    await expect(page.locator('svg[aria-label="KL to the base model"] circle.dot')).to_have_count(4)
    await expect(page.locator("table.moves tbody tr")).to_have_count(4)
    await tab.screenshot("training")
    assert tab.errors == []


async def test_overview_shows_new_groups_scores_and_reward_curve_without_a_reload(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, tab: Tab
) -> None:
    page = tab.page
    await page.goto(f"{sqlite_proxy.root_url}/dashboard")
    await expect(page.get_by_text("No groups yet")).to_be_visible()
    await page.evaluate("() => { window.__sameDocument = true; }")

    await record_everything(http, sqlite_proxy)

    groups = page.locator("#groups tbody tr")
    await expect(groups).to_have_count(2, timeout=WAIT_MS)
    await expect(groups.nth(1).locator(".badge")).to_have_text("scored", timeout=WAIT_MS)
    await expect(page.locator("#reward circle.dot")).to_have_count(8, timeout=WAIT_MS)
    await expect(page.locator("#live-status")).to_contain_text("live")
    assert await page.evaluate("() => window.__sameDocument") is True
    await expect_hostile_text_inert(page)
    await tab.screenshot("overview")

    await page.locator('select[name="split"]').select_option("val")
    await expect(page).to_have_url(f"{sqlite_proxy.root_url}/dashboard?split=val&status=")
    await expect(groups).to_have_count(1)
    await expect(groups.first).to_contain_text("held-out")
    assert tab.errors == []


async def test_admin_key_is_enforced_and_leaves_the_address_for_an_httponly_cookie(
    keyed_proxy: RunningProxy, tab: Tab
) -> None:
    page = tab.page
    root = keyed_proxy.root_url
    refused = await page.goto(f"{root}/dashboard")
    assert refused is not None and refused.status == 401
    await expect(page.locator("h1")).to_have_text("The dashboard needs the admin key")

    opened = await page.goto(f"{root}/dashboard?key={ADMIN_KEY}")
    assert opened is not None and opened.status == 200
    assert page.url == f"{root}/dashboard"
    await expect(page.locator("h1")).to_have_text("Groups")
    (cookie,) = await page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_KEY not in cookie["value"]
    assert await page.evaluate("() => document.cookie") == ""  # no script can read it
    assert ADMIN_KEY not in await page.content()

    again = await page.goto(f"{root}/dashboard/training")
    assert again is not None and again.status == 200
    await page.context.clear_cookies()
    gone = await page.goto(f"{root}/dashboard/training")
    assert gone is not None and gone.status == 401


async def test_a_long_unbroken_error_wraps_inside_the_page(
    sqlite_proxy: RunningProxy, sqlite_url: str, tab: Tab
) -> None:
    """A 404's text quotes a long model name or URL with no space to break at: it wraps in its
    cell instead of widening the page past the window."""
    error = "The model `" + "SmolLM2-135M-Instruct@20/" * 30 + "` does not exist."
    at = utcnow()
    rows = [scenario_row("long", at), group_row("g-long", "long", at)]
    rows += [trajectory_row("t-long", "long", "g-long", at, call_count=1)]
    rows += [call_row("t-long", at, status="upstream_error", http_status=404, error=error)]
    async with TrajectoryStore.opened(sqlite_url) as store:
        await store.write(Batch(rows))
    page = tab.page
    for path in ("/dashboard/trajectories/t-long", "/dashboard/groups/g-long"):
        response = await page.goto(f"{sqlite_proxy.root_url}{path}")
        assert response is not None and response.status == 200
        await expect(page.get_by_text("does not exist").first).to_be_visible()
        widths = await page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], f"{path}: the page is {widths[0]}px wide in {widths[1]}px"
    assert tab.errors == []

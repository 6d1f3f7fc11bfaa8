"""Who may see the dashboard: with an admin key set, only its holder, by Bearer header or by a
session cookie that `?key=` sets once (the key itself leaves the address at once, and is never
echoed, stored in the cookie or logged). Without an admin key it is open, like `/art/`."""

from __future__ import annotations

import logging
from http.cookies import SimpleCookie

import aiohttp
import pytest

from art_proxy.dashboard.guard import COOKIE
from art_proxy.proxy.server import RunningProxy
from tests.dashboard.conftest import ADMIN_KEY, API_KEY

PAGES = (
    "/dashboard",
    "/dashboard/",
    "/dashboard/training",
    "/dashboard/production",
    "/dashboard/groups/any",
    "/dashboard/trajectories/any",
    "/dashboard/static/dashboard.js",
)


async def get(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    async with http.get(url, headers=headers, allow_redirects=False) as response:
        await response.read()
        return response


async def test_dashboard_is_open_without_an_admin_key(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    response = await get(http, sqlite_proxy.root_url + "/dashboard")
    assert response.status == 200


@pytest.mark.parametrize("path", PAGES)
async def test_every_dashboard_path_needs_the_admin_key_when_one_is_set(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession, path: str
) -> None:
    response = await get(http, keyed_proxy.root_url + path)
    assert response.status == 401
    assert response.content_type == "text/html"
    assert "Content-Security-Policy" in response.headers


async def test_the_api_key_does_not_open_the_dashboard(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = await get(http, keyed_proxy.root_url + "/dashboard", headers)
    assert response.status == 401


async def test_a_bearer_admin_key_opens_the_dashboard(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for path in ("/dashboard", "/dashboard/training", "/dashboard/static/dashboard.css"):
        response = await get(http, keyed_proxy.root_url + path, headers)
        assert response.status == 200, path


async def test_key_in_the_address_becomes_a_session_cookie_and_leaves_the_address(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    url = f"{keyed_proxy.root_url}/dashboard/training?run=r%261&key={ADMIN_KEY}"
    response = await get(http, url)
    assert response.status == 303
    assert response.headers["Location"] == "/dashboard/training?run=r%261"
    cookie = SimpleCookie(response.headers["Set-Cookie"])[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/dashboard"
    assert ADMIN_KEY not in cookie.value
    session = {"Cookie": f"{COOKIE}={cookie.value}"}
    followed = await get(http, keyed_proxy.root_url + response.headers["Location"], session)
    assert followed.status == 200
    assert (await get(http, keyed_proxy.root_url + "/dashboard", session)).status == 200
    # The cookie opens the dashboard only, not the admin API.
    assert (await get(http, keyed_proxy.root_url + "/art/v1/groups", session)).status == 401


async def test_a_wrong_key_or_cookie_gets_401_and_no_cookie(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    wrong = "sk-wrong-<b>-key"
    response = await get(http, f"{keyed_proxy.root_url}/dashboard?key={wrong}")
    assert response.status == 401 and "Set-Cookie" not in response.headers
    async with http.get(f"{keyed_proxy.root_url}/dashboard?key={wrong}") as again:
        assert wrong not in await again.text()
    forged = {"Cookie": f"{COOKIE}={ADMIN_KEY}"}
    assert (await get(http, keyed_proxy.root_url + "/dashboard", forged)).status == 401


async def test_the_admin_key_is_never_logged_or_rendered(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    response = await get(http, f"{keyed_proxy.root_url}/dashboard?key={ADMIN_KEY}")
    session = {"Cookie": response.headers["Set-Cookie"].split(";")[0]}
    for path in ("/dashboard", "/dashboard/training", "/dashboard/groups/none"):
        async with http.get(keyed_proxy.root_url + path, headers=session) as page:
            assert ADMIN_KEY not in await page.text()
    assert ADMIN_KEY not in caplog.text

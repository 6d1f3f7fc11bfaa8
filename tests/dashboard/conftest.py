"""A proxy filled with recorded data, with and without an admin key."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings
from tests.dashboard.recorded import Recorded, record_everything

ADMIN_KEY = "sk-dashboard-admin-5e7c9a1b3d"
API_KEY = "sk-dashboard-api-8f2a4c6e0b"


@pytest.fixture
async def recorded(sqlite_proxy: RunningProxy, http: aiohttp.ClientSession) -> Recorded:
    return await record_everything(http, sqlite_proxy)


@pytest.fixture
async def recorded_on_any_store(proxy: RunningProxy, http: aiohttp.ClientSession) -> Recorded:
    """The same data in `proxy`, which runs on SQLite and on PostgreSQL."""
    return await record_everything(http, proxy)


@pytest.fixture
async def keyed_proxy(sqlite_url: str, vllm: FakeVllm) -> AsyncIterator[RunningProxy]:
    settings = proxy_settings(sqlite_url, vllm.base_url, admin_key=ADMIN_KEY, api_key=API_KEY)
    async with running_proxy(settings) as running:
        yield running

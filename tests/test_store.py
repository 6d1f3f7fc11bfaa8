"""The store: migrations build exactly the schema, group commit shares commits, failures isolate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from art_proxy.errors import ConfigError, StoreError
from art_proxy.store import schema
from art_proxy.store.engine import async_url
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch, RowKind


def describe(connection: Connection) -> dict[str, Any]:
    inspector = sa.inspect(connection)
    return {
        table: (
            sorted(column["name"] for column in inspector.get_columns(table)),
            sorted(index["name"] or "" for index in inspector.get_indexes(table)),
        )
        for table in inspector.get_table_names()
        if table != "alembic_version"
    }


async def test_migrations_create_exactly_the_schema(store_url: str) -> None:
    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        async with store.engine.connect() as connection:
            migrated = await connection.run_sync(describe)
    finally:
        await store.aclose()
    expected = {
        table.name: (
            sorted(column.name for column in table.columns),
            sorted(str(index.name) for index in table.indexes),
        )
        for table in schema.metadata.sorted_tables
    }
    assert migrated == expected


async def test_opening_twice_is_idempotent(store_url: str) -> None:
    for _ in range(2):
        store = await TrajectoryStore.open(store_url)
        await store.aclose()


def trajectory_rows(index: int) -> list[tuple[RowKind, dict[str, Any]]]:
    now = utcnow()
    return [
        (RowKind.scenario, {"id": "s", "created_at": now, "auto": False, "opening": []}),
        (RowKind.group, {"id": "g", "scenario_id": "s", "created_at": now}),
        (
            RowKind.trajectory,
            {
                "id": f"t{index}",
                "scenario_id": "s",
                "group_id": "g",
                "split": "train",
                "status": "open",
                "created_at": now,
                "updated_at": now,
                "upstream": "http://u/v1",
                "call_count": 0,
                "metrics": {},
                "metadata": {},
            },
        ),
    ]


async def test_concurrent_writes_share_commits(store_url: str) -> None:
    store = await TrajectoryStore.open(store_url)
    try:
        await asyncio.gather(*(store.write(Batch(trajectory_rows(i))) for i in range(200)))
        assert store.writer.batches == 200
        assert store.writer.commits < 200
        assert len(await store.trajectories(limit=1000)) == 200
    finally:
        await store.aclose()


async def test_a_bad_batch_fails_alone_and_its_neighbours_commit(store_url: str) -> None:
    store = await TrajectoryStore.open(store_url)
    try:
        bad = Batch([(RowKind.call, {"id": "c", "trajectory_id": "missing"})])  # NOT NULL columns
        results = await asyncio.gather(
            *(store.write(Batch(trajectory_rows(i))) for i in range(5)),
            store.write(bad),
            *(store.write(Batch(trajectory_rows(i))) for i in range(5, 10)),
            return_exceptions=True,
        )
        assert [isinstance(r, StoreError) for r in results] == [False] * 5 + [True] + [False] * 5
        assert len(await store.trajectories()) == 10
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///art.db", "sqlite+aiosqlite:///art.db"),
        ("postgresql://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_store_urls_get_their_async_driver(url: str, expected: str) -> None:
    assert async_url(url) == expected


@pytest.mark.parametrize("url", ["mysql://x/y", "not a url", "sqlite://", "sqlite:///:memory:"])
def test_unsupported_store_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        async_url(url)

"""The store: migrations build exactly the schema, group commit shares commits, failures isolate."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import Connection
from sqlalchemy.dialects import sqlite as sqlite_dialect

from art_proxy.errors import ConfigError, StoreError
from art_proxy.proxy.server import running_proxy
from art_proxy.records import FinishRequest, GroupRecord
from art_proxy.store import schema
from art_proxy.store.dashboard import GROUP_STATUSES, DashboardQueries, GroupFilter
from art_proxy.store.engine import _alembic_config, async_url, create_engine, migrate
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch, Row, RowKind, _sqlite_datetime, _statements
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig
from tests.conftest import proxy_settings
from tests.store_rows import call_row, group_row, scenario_row, trajectory_row


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


def trajectory_rows(index: int) -> list[tuple[RowKind, Row]]:
    now = utcnow()
    return [
        scenario_row("s", now),
        group_row("g", "s", now),
        trajectory_row(f"t{index}", "s", "g", now),
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
        missing = cast(Row, {"id": "c", "trajectory_id": "missing"})  # NOT NULL columns left out
        bad = Batch([(RowKind.call, missing)])
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


async def test_sqlite_runs_in_wal_mode_and_checkpoints_every_10000_pages(sqlite_url: str) -> None:
    """A checkpoint every 1,000 pages (SQLite's default) rewrote the indexes' hot pages into the
    database ten times as often: 40% more CPU a record ingested, 30 records a commit."""
    engine = create_engine(sqlite_url)
    try:
        async with engine.connect() as connection:
            journal_mode = (await connection.exec_driver_sql("PRAGMA journal_mode")).scalar()
            pages = (await connection.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar()
    finally:
        await engine.dispose()
    assert (journal_mode, pages) == ("wal", 10_000)


async def test_sqlite_rows_written_by_the_cursor_equal_those_sqlalchemy_execute_writes(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The writer runs SQLite statements through the sqlite3 cursor, with SQL and value
    conversions compiled by SQLAlchemy; replaying the real relay's batches (a new trajectory, a
    continued one, a stream, a failed call) through `Connection.execute` must give the same rows."""
    written: list[Batch] = []
    (tmp_path / "checks.py").write_text("def longer(messages, choice):\n    return 0.5\n")
    settings = proxy_settings(
        sqlite_url, vllm.base_url, best_of_check=f"{tmp_path}/checks.py:longer"
    )
    async with running_proxy(settings) as proxy:
        writer = proxy.parts.store.writer
        commit = writer.commit

        async def recording(batches: Sequence[Batch], *, skip_recorded: bool = False) -> None:
            written.extend(batches)  # through the journal: its frames' rows, read back
            await commit(batches, skip_recorded=skip_recorded)

        writer.commit = recording  # type: ignore[method-assign]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        first = await chat_json(http, proxy.base_url, messages)
        messages.append(first["choices"][0]["message"])
        messages.append({"role": "user", "content": "and then?"})
        await chat_json(http, proxy.base_url, messages)  # continues: a call and a touch
        await chat_json(http, proxy.base_url, [{"role": "user", "content": "s"}], stream=True)
        await chat_json(http, proxy.base_url, [{"role": "user", "content": "x"}], max_tokens=-1)
        # Best-of-N writes its judgment with a candidate; a guided call, where its guidance sits.
        best_of = {"X-Art-Best-Of": "2", "X-Art-Guidance": "a%20hint"}
        await chat_json(http, proxy.base_url, [{"role": "user", "content": "b"}], headers=best_of)
        guided = {"X-Art-Guidance": "a%20hint"}
        await chat_json(http, proxy.base_url, [{"role": "user", "content": "g"}], headers=guided)
        await chat_json(
            http, proxy.base_url, [{"role": "user", "content": "c"}], headers={"X-Art-Best-Of": "2"}
        )
        await proxy.parts.settled()
    assert {kind for batch in written for kind, _ in batch.rows} == set(RowKind)

    replayed_url = f"sqlite:///{tmp_path / 'replayed.db'}"
    async with TrajectoryStore.opened(replayed_url, writer=False):
        pass  # migrated
    statements = _statements("sqlite")

    def replay(connection: Connection) -> None:
        for batch in written:
            for kind, row in sorted(batch.rows, key=lambda kind_row: kind_row[0]):
                connection.execute(statements[kind], [row])

    replayed = create_engine(replayed_url)  # the store's engine options (its JSON serializer)
    async with replayed.begin() as connection:
        await connection.run_sync(replay)
    recorded = create_engine(sqlite_url)
    try:
        for table in ("scenarios", "groups", "trajectories", "calls", "judgments"):
            query = f"SELECT * FROM {table} ORDER BY 1"
            async with recorded.connect() as a, replayed.connect() as b:
                rows = (await a.exec_driver_sql(query)).all()
                assert rows and rows == (await b.exec_driver_sql(query)).all(), table
    finally:
        await recorded.dispose()
        await replayed.dispose()


async def test_each_lookup_reads_trajectories_by_its_own_index(sqlite_url: str) -> None:
    """SQLite's planner has no statistics in a store nobody ran ANALYZE on (all of them), and then
    took an index led by `status` for any `status = ?`: a proxy's lookup of the trajectory a call
    continues read every open trajectory (15 ms a call beside 30,000), the trainer's query for a few
    groups' members every finished one. Each lookup must reach trajectories by the index made for
    it, never by reading them all."""
    async with TrajectoryStore.opened(sqlite_url) as store:
        now = utcnow()
        rows = [scenario_row("s", now), group_row("g", "s", now)]
        rows += [trajectory_row(f"t{index}", "s", "g", now) for index in range(2)]
        await store.write(Batch(rows))
        for index in range(2):
            await store.finish(f"t{index}", FinishRequest(reward=1.0))
        lookups: dict[str, tuple[Callable[[], Awaitable[object]], set[str]]] = {
            "a continued trajectory, by its tip": (
                lambda: store.open_trajectories_by_tip(["k" * 32], ["p" * 32]),
                {"ix_trajectories_tip_key", "ix_trajectories_tip_prompt_key"},
            ),
            "the same, without prompt keys": (
                lambda: store.open_trajectories_by_tip(["k" * 32]),
                {"ix_trajectories_tip_key"},
            ),
            "groups active in the last second": (
                lambda: store.active_groups(now),
                {"ix_trajectories_open_updated", "ix_trajectories_group"},
            ),
            "idle trajectories to finish": (
                lambda: store.finish_idle(now - timedelta(hours=1)),
                {"ix_trajectories_open_updated"},
            ),
            "one group's finished trajectories": (
                lambda: store.trajectories(status="finished", group="g"),
                {"ix_trajectories_group"},
            ),
            "one scenario's trajectories of a split": (
                lambda: store.trajectories(scenario="s", split="train"),
                {"ix_trajectories_scenario_status"},
            ),
            "the scenario bank's scenarios with a trajectory of a split": (
                lambda: store.bank_scenarios("train"),
                {"ix_trajectories_scenario_status"},
            ),
            "the trainer's groups and their members' rewards": (
                lambda: store.trainable_groups("run", source="finish"),
                {"ix_trajectories_group"},
            ),
        }
        with _plans(store) as steps:
            for name, (lookup, indexes) in lookups.items():
                steps.clear()
                await lookup()
                reads = [step for step in steps if " trajectories" in step]
                used = {index for index in indexes if any(index in step for step in reads)}
                assert reads and used == indexes, (name, steps)
                assert all(any(index in step for index in indexes) for step in reads), (name, steps)


async def test_a_list_reads_its_page_from_an_index_instead_of_sorting_every_row(
    sqlite_url: str,
) -> None:
    """A list of trajectories, groups or judgments, newest or oldest first, reads its page from
    the end of an index by `created_at`: sorting the whole table took 290-350 ms a page beside
    200,000 trajectories, and grew with the store."""
    now = utcnow()
    last = GroupRecord(
        id="g", scenario_id="s", created_at=now, size=1, open_count=0, newest_started_at=now
    )
    async with TrajectoryStore.opened(sqlite_url) as store:
        lists: dict[str, tuple[Callable[[], Awaitable[object]], str]] = {
            "trajectories": (lambda: store.trajectories(limit=5), "ix_trajectories_created"),
            "finished ones": (
                lambda: store.trajectories(status="finished", limit=5),
                "ix_trajectories_created",
            ),
            "oldest first, a later page": (
                lambda: store.trajectories(oldest_first=True, limit=5, offset=5),
                "ix_trajectories_created",
            ),
            "groups": (lambda: store.groups(limit=5), "ix_groups_created"),
            "judgments": (lambda: store.judgments(limit=5), "ix_judgments_created"),
            "the judge's next page of unjudged groups": (
                lambda: store.unjudged_groups(
                    judge_model="j", mode="json", rubric_hash="r", limit=5, after=last
                ),
                "ix_groups_created",
            ),
        }
        dashboard = DashboardQueries(store.engine)
        for status in (None, *GROUP_STATUSES):
            lists[f"the dashboard's {status or 'all'} groups"] = (
                functools.partial(dashboard.group_page, GroupFilter(status=status, split="train")),
                "ix_groups_created",
            )
        with _plans(store) as steps:
            for name, (read, index) in lists.items():
                steps.clear()
                await read()
                # Walked in its order, the walk stopping at the page's end; no table read whole.
                assert any(f"USING INDEX {index}" in step for step in steps), (name, steps)
                assert not any(
                    re.fullmatch(r"SCAN (groups|trajectories|judgments)( USING .*)?", step)
                    and f"USING INDEX {index}" not in step
                    for step in steps
                ), (name, steps)
                # A group's own rows are looked up by its id, never by walking another index.
                assert all(
                    any(
                        key in step
                        for key in ("ix_trajectories_group", "ix_judgments_group", "(id=?)")
                    )
                    for step in steps
                    if re.match(r"SEARCH (trajectories|judgments)", step)
                ), (name, steps)


async def test_the_judges_pages_of_unjudged_groups_cover_each_once_ties_included(
    store_url: str,
) -> None:
    """Each page starts after the last group of the one before, by (created_at, id): groups made
    in the same microsecond (here four of them) are neither skipped nor read twice."""
    async with TrajectoryStore.opened(store_url) as store:
        now = utcnow()
        later, latest = now + timedelta(seconds=1), now + timedelta(seconds=2)
        times = [now, now, now, later, latest, now]
        rows = [scenario_row("s", now)]
        for index, at in enumerate(times):
            rows += [
                group_row(f"g{index}", "s", at),
                trajectory_row(f"t{index}", "s", f"g{index}", at),
            ]
        rows.append(group_row("empty", "s", now))  # no member: not a group to judge
        await store.write(Batch(rows))
        seen: list[str] = []
        last = None
        while True:
            page = await store.unjudged_groups(
                judge_model="j", mode="json", rubric_hash="r", limit=2, after=last
            )
            seen += [group.id for group in page]
            if len(page) < 2:
                break
            last = page[-1]
    assert seen == ["g0", "g1", "g2", "g5", "g3", "g4"]


@contextlib.contextmanager
def _plans(store: TrajectoryStore) -> Iterator[list[str]]:
    """SQLite's plan of each statement `store` runs meanwhile, a line a step, in the list."""
    steps: list[str] = []
    explain = functools.partial(_explain_into, steps)
    sa.event.listen(store.engine.sync_engine, "before_cursor_execute", explain)
    try:
        yield steps
    finally:
        sa.event.remove(store.engine.sync_engine, "before_cursor_execute", explain)


def _explain_into(
    steps: list[str],
    connection: Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> None:
    """A `before_cursor_execute` listener: SQLite's plan for `statement`, a line a step."""
    if executemany or not statement.lstrip().upper().startswith(("SELECT", "UPDATE")):
        return
    explaining = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        explaining.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        steps.extend(str(row[-1]) for row in explaining.fetchall())
    finally:
        explaining.close()


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 11, 25, 9, 41, 28, 123456, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # no microseconds: still six digits
        datetime(2026, 6, 1, 23, 59, 59, 1, tzinfo=timezone(timedelta(hours=-7))),
        datetime(999, 12, 31, 0, 0, 0, 500),  # naive, a three-digit year
        None,
    ],
)
def test_the_writers_sqlite_datetime_text_is_sqlalchemys(value: datetime | None) -> None:
    """The writer formats datetimes itself, faster than SQLAlchemy's SQLite processor; a stored
    timestamp that differed would sort and compare differently from those SQLAlchemy wrote."""
    dialect = sqlite_dialect.dialect()
    sqlalchemys = schema.calls.c.created_at.type.dialect_impl(dialect).bind_processor(dialect)
    assert sqlalchemys is not None
    assert _sqlite_datetime(value) == sqlalchemys(value)


async def chat_json(
    http: aiohttp.ClientSession,
    base_url: str,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One chat call; the answer's JSON (a stream's last chunk; an error's body)."""
    body = {"model": FakeVllmConfig().model, "messages": messages, **fields}
    async with http.post(f"{base_url}/chat/completions", json=body, headers=headers) as response:
        if not fields.get("stream"):
            answer: dict[str, Any] = await response.json()
            return answer
        chunks = [line[6:] async for line in response.content if line.startswith(b"data: {")]
        last: dict[str, Any] = orjson.loads(chunks[-1])
        return last


async def test_calls_at_one_seq_are_renumbered_by_the_migration_and_then_refused(
    store_url: str,
) -> None:
    """Stores written before seqs were unique may hold two calls at one seq (a restarted proxy
    numbered a trajectory from 0 again): every call is kept, renumbered in recorded order; after
    it the store refuses a second call at a seq, an integrity error (the record is set aside)."""
    engine = create_engine(store_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)

    def upgrade_to(revision: str) -> Callable[[Connection], None]:
        def upgrade(connection: Connection) -> None:
            config = _alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

        return upgrade

    def insert(connection: Connection, rows: list[tuple[RowKind, Row]]) -> None:
        tables = {
            RowKind.scenario: schema.scenarios,
            RowKind.group: schema.groups,
            RowKind.trajectory: schema.trajectories,
            RowKind.call: schema.calls,
        }
        for kind, row in rows:
            connection.execute(sa.insert(tables[kind]), [dict(row)])

    clashing = [  # (id, seq, minutes): two calls at seq 0, the second recorded after a restart
        ("a", 0, 0),
        ("b", 1, 1),
        ("c", 0, 2),
        ("d", 1, 3),
    ]
    rows = [scenario_row("s", at), group_row("g", "s", at)]
    rows += [trajectory_row("t", "s", "g", at), trajectory_row("u", "s", "g", at)]
    rows += [
        call_row("t", at + timedelta(minutes=minutes), id=call_id, seq=seq)
        for call_id, seq, minutes in clashing
    ]
    rows += [call_row("u", at, id="e", seq=0), call_row("u", at, id="f", seq=1)]
    try:
        async with engine.begin() as connection:
            await connection.run_sync(upgrade_to("0012"))
            await connection.run_sync(insert, rows)
        await migrate(engine)
        async with engine.connect() as connection:
            calls = (
                await connection.execute(
                    sa.select(
                        schema.calls.c.trajectory_id, schema.calls.c.id, schema.calls.c.seq
                    ).order_by(schema.calls.c.trajectory_id, schema.calls.c.seq)
                )
            ).all()
        assert [tuple(call) for call in calls] == [
            ("t", "a", 0),
            ("t", "b", 1),
            ("t", "c", 2),  # the restarted proxy's seq 0 and 1, recorded after the first run's
            ("t", "d", 3),
            ("u", "e", 0),
            ("u", "f", 1),
        ]
        with pytest.raises(sa.exc.IntegrityError):
            async with engine.begin() as connection:
                await connection.run_sync(insert, [call_row("t", at, id="g", seq=2)])
    finally:
        await engine.dispose()

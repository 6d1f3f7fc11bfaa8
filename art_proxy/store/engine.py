"""Store URLs, engines and migrations.

Users write `sqlite:///art.db` or `postgresql://...`; the async drivers (aiosqlite, asyncpg) are
filled in here so the same code serves both. Engines hide statement parameters from errors and
logs: they are conversation content, which belongs in the store and nowhere else. SQLite runs in WAL mode with `synchronous=NORMAL`: a
commit is durable against the process being killed (the WAL is in the OS page cache), which is the
durability the proxy promises by default, without an fsync per commit. A proxy promising power
loss (`--durability power`) writes with `synchronous=FULL`: each commit fsyncs the WAL before the
journal lets go of its records.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import orjson
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from art_proxy.errors import ConfigError, StoreError
from art_proxy.privacy.private_files import create_private

_MIGRATIONS = Path(__file__).parent / "migrations"
# Seconds a SQLite writer waits for another writer (a second proxy, `export` while serving).
_SQLITE_BUSY_TIMEOUT_MS = 10_000
# Pages the WAL grows to before a commit copies them into the database (SQLite's default: 1,000).
# Each commit writes every page it dirtied to the WAL, and a record dirties a page in each index of
# a hashed key; a checkpoint writes each page once, however many commits rewrote it. The proxy's
# ingester, 30 records a commit (16 calls in flight, 10 ms gathered), 20,000 records: 180 -> 129 us
# of CPU a record; the proxy at 16 in flight recorded 1-17% more calls a second in each of 12
# alternating pairs. The price: a WAL file of up to 40 MB, and a commit that checkpoints takes
# 35 ms instead of 15 (which only `--journal off` makes a call wait for).
_SQLITE_WAL_CHECKPOINT_PAGES = 10_000
_POSTGRES_CONNECT_TIMEOUT_S = 10
# Seconds any one statement may take on PostgreSQL, timed by the client (asyncpg's
# command_timeout): a connection that goes silent (a partition, a server that stopped answering
# without closing) fails its statement instead of hanging it, so the ingester marks the store
# unavailable and retries on a new connection. A server-side statement_timeout would not see a
# silent network. The proxy's statements take milliseconds; the slowest the project runs, a
# migration building an index, took 0.2 s over a million trajectories.
_POSTGRES_COMMAND_TIMEOUT_S = 60.0
# A connection with nothing moving is probed after 30 s idle, every 10 s, dead after 3 unanswered.
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_COUNT = 30, 10, 3


def async_url(url: str) -> str:
    """`sqlite:///f.db` -> `sqlite+aiosqlite:///f.db`, `postgresql://` -> `postgresql+asyncpg://`."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"store URL {url!r} is not a database URL") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError("the store must be a file (sqlite:///art.db): memory is not shared")
    elif backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ConfigError(f"store URL {url!r}: only sqlite:/// and postgresql:// are supported")
    return parsed.render_as_string(hide_password=False)


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_ESCAPED_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _jsonb_dumps(value: Any) -> str:
    """JSON for PostgreSQL's JSONB, which refuses the NUL character: it is stored as U+FFFD, so a
    request carrying one is still recorded rather than failing its whole transaction."""
    text = orjson.dumps(value).decode()
    return _ESCAPED_NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


# Shared by every engine: JSON columns through orjson, parameters kept out of errors and logs.
_ENGINE_OPTIONS: dict[str, Any] = {
    "hide_parameters": True,
    "json_serializer": _json_dumps,
    "json_deserializer": orjson.loads,
}


def create_engine(url: str, *, existing: bool = False) -> AsyncEngine:
    """An engine on the store at `url`; `existing`: a SQLite file that is not there is refused
    (a read command's misspelt --store would otherwise read as a new, empty store)."""
    full_url = async_url(url)
    if full_url.startswith("sqlite"):
        database = make_url(full_url).database
        assert database is not None
        if existing and not Path(database).exists():
            raise ConfigError(
                f"no store at {url}: {database} does not exist (a read makes none; check --store)"
            )
        if not Path(database).parent.exists():
            raise ConfigError(f"store {url!r}: folder {Path(database).parent} does not exist")
        create_private(Path(database))  # its -wal and -shm take its mode
        engine = create_async_engine(full_url, **_ENGINE_OPTIONS)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_async_engine(
        full_url,
        pool_size=10,
        max_overflow=10,
        pool_pre_ping=True,
        # A server that went away mid-connect fails a connect in seconds, not asyncpg's minute.
        connect_args={
            "timeout": _POSTGRES_CONNECT_TIMEOUT_S,
            "command_timeout": _POSTGRES_COMMAND_TIMEOUT_S,
            # The server's side of the same bounds: a statement of a proxy that went silent is
            # cancelled (its locks let go) and its connection found dead.
            "server_settings": {
                "statement_timeout": str(int(_POSTGRES_COMMAND_TIMEOUT_S * 1000)),
                "tcp_keepalives_idle": str(_KEEPALIVE_IDLE_S),
                "tcp_keepalives_interval": str(_KEEPALIVE_INTERVAL_S),
                "tcp_keepalives_count": str(_KEEPALIVE_COUNT),
            },
        },
        **{**_ENGINE_OPTIONS, "json_serializer": _jsonb_dumps},
    )
    event.listen(engine.sync_engine, "connect", _postgres_keepalive)
    return engine


def _postgres_keepalive(dbapi_connection: Any, _record: Any) -> None:
    """TCP keepalives on the proxy's end of each connection, so that an idle pooled connection
    to a server that vanished (a partition: no reset ever comes) is found dead in about a
    minute, not the kernel's two hours. asyncpg has no option for it: its transport's socket."""
    transport = getattr(dbapi_connection.driver_connection, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket: nothing between the two ends to lose
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", _KEEPALIVE_COUNT),
    ):
        if hasattr(socket, option):  # Linux names; macOS has TCP_KEEPALIVE for the first
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


TransactionBody = Callable[[sa.Connection], None]


class TransactionRunner(Protocol):
    """Runs a synchronous transaction body; how depends on the database (see below)."""

    async def run(self, body: TransactionBody) -> None: ...

    async def aclose(self) -> None: ...


class AsyncEngineRunner:
    """PostgreSQL: the body runs on the async engine (asyncpg), one network round trip a statement."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def run(self, body: TransactionBody) -> None:
        async with self._engine.begin() as connection:
            await connection.run_sync(body)

    async def aclose(self) -> None:
        return None


class SqliteThreadRunner:
    """SQLite: the whole transaction in one hop to a dedicated thread with a plain sqlite3 engine.

    Through aiosqlite every statement, BEGIN and COMMIT is its own hop between the event loop and
    aiosqlite's thread (about 17 per recorded call); here a transaction is one hop, which is most
    of what a recorded call costs. One thread is also SQLite's single writer.
    """

    def __init__(self, url: str, *, power_safe: bool = False) -> None:
        database = make_url(async_url(url)).database
        assert database is not None
        create_private(Path(database))  # its -wal and -shm take its mode
        self._engine = sa.create_engine(
            f"sqlite:///{database}",
            pool_size=1,
            max_overflow=0,
            connect_args={"check_same_thread": False},
            **_ENGINE_OPTIONS,
        )
        event.listen(
            self._engine, "connect", _sqlite_full_sync_pragmas if power_safe else _sqlite_pragmas
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-proxy-sqlite")
        # Held by the thread for its life: a pool checkout and reset cost about 25 us a
        # transaction (measured on the proxy's rows: 158 -> 133 us).
        self._connection: sa.Connection | None = None

    def _transaction(self, body: TransactionBody) -> None:
        if self._connection is None:
            self._connection = self._engine.connect()
        with self._connection.begin():
            body(self._connection)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._engine.dispose()

    async def run(self, body: TransactionBody) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._transaction, body)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)


def transaction_runner(
    url: str, engine: AsyncEngine, *, power_safe: bool = False
) -> TransactionRunner:
    """`power_safe`: a commit survives power loss once it returns (PostgreSQL's always does)."""
    if engine.dialect.name == "sqlite":
        return SqliteThreadRunner(url, power_safe=power_safe)
    return AsyncEngineRunner(engine)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any, synchronous: str = "NORMAL") -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA wal_autocheckpoint={_SQLITE_WAL_CHECKPOINT_PAGES}")
    # Deleted rows' bytes zeroed, not left in free pages (erasure, retention): not every SQLite
    # build has it on by default.
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


def _sqlite_full_sync_pragmas(dbapi_connection: Any, record: Any) -> None:
    _sqlite_pragmas(dbapi_connection, record, synchronous="FULL")


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


async def migrate(engine: AsyncEngine) -> None:
    """Bring the store's tables to the newest revision (idempotent)."""

    def upgrade(connection: Connection) -> None:
        config = _alembic_config()
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError as exc:
            # The store's revision is none of ours: a newer art-proxy migrated it.
            head = ScriptDirectory.from_config(config).get_current_head()
            raise StoreError(
                f"this store was written by a newer art-proxy ({exc}; this one knows schema "
                f"revisions up to {head}): upgrade art-proxy to open it"
            ) from exc

    async with engine.begin() as connection:
        await connection.run_sync(upgrade)

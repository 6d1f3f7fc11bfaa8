"""Store URLs, engines and migrations.

Users write `sqlite:///art.db` or `postgresql://...`; the async drivers (aiosqlite, asyncpg) are
filled in here so the same code serves both. Engines hide statement parameters from errors and
logs: they are conversation content, which belongs in the store and nowhere else. SQLite runs in WAL mode with `synchronous=NORMAL`: a
commit is durable against the process being killed (the WAL is in the OS page cache), which is the
durability the proxy promises, without an fsync per commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from art_proxy.errors import ConfigError

_MIGRATIONS = Path(__file__).parent / "migrations"
# Seconds a SQLite writer waits for another writer (a second proxy, `export` while serving).
_SQLITE_BUSY_TIMEOUT_MS = 10_000


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


def create_engine(url: str) -> AsyncEngine:
    full_url = async_url(url)
    if full_url.startswith("sqlite"):
        database = make_url(full_url).database
        assert database is not None
        if not Path(database).parent.exists():
            raise ConfigError(f"store {url!r}: folder {Path(database).parent} does not exist")
        engine = create_async_engine(full_url, hide_parameters=True)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        full_url, pool_size=10, max_overflow=10, pool_pre_ping=True, hide_parameters=True
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


async def migrate(engine: AsyncEngine) -> None:
    """Bring the store's tables to the newest revision (idempotent)."""

    def upgrade(connection: Connection) -> None:
        config = _alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")

    async with engine.begin() as connection:
        await connection.run_sync(upgrade)

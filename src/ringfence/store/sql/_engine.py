"""Engines: which URL names which database and driver, and how each is connected and migrated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ringfence.errors import StoreError
from ringfence.store import migrations

__all__ = ["create_engine", "migrate", "parse_url", "sqlite_url"]


class _Driver(NamedTuple):
    name: str  # the async driver the store runs on
    extra: str  # the extra of ringfence that installs it
    sync: str  # the driver the migrations run on (see SqlStore._migrate)


_DRIVERS = {
    "sqlite": _Driver("aiosqlite", "server", "pysqlite"),
    "postgresql": _Driver("psycopg", "postgres", "psycopg"),
}
_SQLITE_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another before "database is locked"
_POSTGRES_CONNECT_TIMEOUT = 10  # seconds


def sqlite_url(data_dir: Path) -> str:
    """The URL of the default store: the file ``ringfence.db`` in ``data_dir``."""
    path = data_dir.absolute() / "ringfence.db"
    return URL.create("sqlite+aiosqlite", database=str(path)).render_as_string()


def parse_url(url: str | URL) -> URL:
    """The URL with its async driver.

    Raises:
        StoreError: the URL cannot be parsed, or names another database or driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        # Not chained: an unparsable URL cannot be shown with its password hidden.
        raise StoreError(
            "the store's URL cannot be parsed: expected sqlite:///PATH "
            "or postgresql://USER:PASSWORD@HOST/DATABASE"
        ) from None
    backend = parsed.get_backend_name()
    if backend not in _DRIVERS:
        raise StoreError(f"the store runs on sqlite or postgresql, not {backend!r}")
    driver = f"{backend}+{_DRIVERS[backend].name}"
    if parsed.drivername == backend:
        return parsed.set(drivername=driver)
    if parsed.drivername != driver:
        raise StoreError(f"the store needs the driver {driver}, not {parsed.drivername}")
    return parsed


def create_engine(url: URL) -> AsyncEngine:
    """An engine for ``url``; for a SQLite file, the file is created first.

    Raises:
        StoreError: the driver is not installed, or the SQLite file cannot be created.
    """
    driver = _DRIVERS[url.get_backend_name()]
    if url.get_backend_name() == "sqlite":
        _create_private_file(url)
    try:
        engine = create_async_engine(url, connect_args=_connect_args(url), **_pool_options(url))
    except ImportError as exc:
        raise StoreError(
            f"the store needs the {driver.name} package: pip install 'ringfence[{driver.extra}]'"
        ) from exc
    _configure(engine.sync_engine)
    return engine


def migrate(url: URL) -> None:
    """Bring the schema of the database at ``url`` (an async driver's) up to date.

    Raises:
        alembic.util.CommandError: a newer Ringfence migrated it.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    backend = url.get_backend_name()
    sync_url = url.set(drivername=f"{backend}+{_DRIVERS[backend].sync}")
    engine = sa.create_engine(sync_url, connect_args=_connect_args(url), poolclass=sa.NullPool)
    _configure(engine)
    try:
        with engine.begin() as connection:
            migrations.upgrade(connection)
    finally:
        engine.dispose()


def _connect_args(url: URL) -> dict[str, Any]:
    """The driver's timeouts, unless the URL's query string sets them itself."""
    if url.get_backend_name() == "postgresql":
        defaults: dict[str, Any] = {"connect_timeout": _POSTGRES_CONNECT_TIMEOUT}
    else:
        defaults = {"timeout": _SQLITE_BUSY_TIMEOUT}
    return {name: value for name, value in defaults.items() if name not in url.query}


def _pool_options(url: URL) -> dict[str, Any]:
    if url.get_backend_name() == "postgresql":
        return {"pool_pre_ping": True}  # a connection may have died with a server restart
    # SQLite lets one writer in at a time, and every transaction here writes (BEGIN
    # IMMEDIATE). With one connection, this process's tasks queue for it in the pool instead
    # of polling the file lock; other processes still wait up to the busy timeout.
    return {"pool_size": 1, "max_overflow": 0}


def _configure(engine: sa.Engine) -> None:
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)


def _create_private_file(url: URL) -> None:
    """Create the SQLite file, and its directory, for this user's eyes only (keys' hashes
    live there). SQLite gives its -wal and -shm files the permissions of the database file.

    Raises:
        StoreError: they cannot be created.
    """
    if not url.database or url.database == ":memory:" or url.query.get("uri"):
        return
    path = Path(url.database)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        raise StoreError(f"cannot create the SQLite database {path}: {exc.strerror}") from exc


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # sqlite3 begins transactions by itself only before INSERT, UPDATE and DELETE, leaving
    # reads and DDL outside them. Turn that off: _sqlite_begin begins every transaction.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    # WAL: a reader elsewhere (a backup, the sqlite3 shell) and our writer do not block each
    # other, and a commit appends to one file.
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit survives a crash
    # of the server (SIGKILL included) and only a power loss may take the last ones back.
    # FULL's fsync per commit measured up to 30 ms here, on the path of every sandbox create.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: sa.Connection) -> None:
    # Take the write lock at once, waiting up to the busy timeout. A deferred transaction
    # that reads and then writes fails at once with "database is locked" when another
    # process wrote in between; and two processes migrating at once serialise on this lock.
    connection.exec_driver_sql("BEGIN IMMEDIATE")

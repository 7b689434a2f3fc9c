"""Databases for the SQL store's tests: a fresh SQLite file, or a fresh PostgreSQL database.

PostgreSQL is the real server that ``scripts/postgres`` starts (``scripts/test`` does it and
exports its URL). Without it the PostgreSQL tests fail rather than skip: CI must run them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ringfence.store.sql import sqlite_url

POSTGRES_URL_VARIABLE = "RINGFENCE_TEST_POSTGRES_URL"


@pytest.fixture
def sqlite_database(tmp_path: Path) -> str:
    """The URL of a SQLite file that does not exist yet, in a directory that does not either."""
    return sqlite_url(tmp_path / "data")


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped after the test."""
    with new_postgres_database() as url:
        yield url


@contextlib.contextmanager
def new_postgres_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped at the end."""
    base = os.environ.get(POSTGRES_URL_VARIABLE)
    if not base:
        pytest.fail(
            f"{POSTGRES_URL_VARIABLE} is not set: start the test PostgreSQL with "
            f"`export {POSTGRES_URL_VARIABLE}=$(scripts/postgres)` (scripts/test does)",
            pytrace=False,
        )
    url = make_url(base)
    name = f"ringfence_test_{uuid.uuid4().hex[:16]}"
    maintenance = sa.create_engine(
        url.set(database="postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
    )
    try:
        with maintenance.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield url.set(database=name).render_as_string(hide_password=False)
        with maintenance.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        maintenance.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> str:
    """Each kind of database in turn: the URL of a fresh one."""
    url: str = request.getfixturevalue(f"{request.param}_database")
    return url

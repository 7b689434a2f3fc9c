"""The SQL store's schema, as Alembic migrations that ``SqlStore.open`` applies.

Users never run Alembic themselves: ``upgrade`` configures it in code (no alembic.ini) and
brings the database to the newest revision on every start, which is a no-op when it is there.
A new revision is a hand-written ``versions/NNNN_what.py`` whose ``down_revision`` is the
previous one; SQLite can alter a table only through ``op.batch_alter_table``.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

__all__ = ["VERSION_TABLE", "upgrade"]

# Named for us, so that a PostgreSQL database shared with another Alembic user stays apart.
VERSION_TABLE = "ringfence_alembic_version"

# Key of the PostgreSQL advisory lock taken around an upgrade: the bytes of "ringfenc".
_LOCK_KEY = 0x72696E6766656E63

# Alembic keeps the migration it runs in module globals (alembic.op, alembic.context).
_ONE_AT_A_TIME_IN_THIS_PROCESS = threading.Lock()


def upgrade(connection: Connection) -> None:
    """Bring the schema to the newest revision, inside the connection's transaction.

    The caller commits. Two processes starting at once must not both create the tables:
    on PostgreSQL the transaction first takes an advisory lock, released when it ends, and
    the second process then finds the schema up to date; on SQLite the caller's transaction
    already holds the database's write lock (``BEGIN IMMEDIATE``). Within one process,
    upgrades run one at a time; call this from a thread that may block.

    Raises:
        alembic.util.CommandError: the database is at a revision this code does not know
            (a newer Ringfence migrated it).
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = connection
    with _ONE_AT_A_TIME_IN_THIS_PROCESS:
        command.upgrade(config, "head")

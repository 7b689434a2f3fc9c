"""Alembic's entry point: runs the migrations on the connection that ``upgrade`` passes in."""

from alembic import context
from sqlalchemy.engine import Connection

from ringfence.store.migrations import VERSION_TABLE

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError("run the migrations with ringfence.store.migrations.upgrade()")
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()

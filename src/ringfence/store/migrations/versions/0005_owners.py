"""Owners: which control-plane replica runs each execution, sandbox and proposal.

With several replicas on one database, a replica that starts must end only what a replica
that is gone left running, never what a live one runs. Each row names the replica that runs
it (``store._replica``); NULL, for rows written before, counts as gone.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TABLES = ("executions", "sandboxes", "proposals")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("owner", sa.BigInteger, nullable=True))


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "owner")

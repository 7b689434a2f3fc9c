"""Snapshots: a tenant's persisted sandbox checkpoints (their files are on the server's disk).

Sandboxes themselves need no change: a paused one is a record in the ``paused`` state (the
column is wide enough), its pause details in its JSON.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        # Unique across tenants (as sandbox ids are): E2B names a snapshot by its id alone.
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("snapshots_seq", "snapshots", ["seq"], unique=True)
    op.create_index("snapshots_tenant_seq", "snapshots", ["tenant", "seq"])


def downgrade() -> None:
    op.drop_table("snapshots")

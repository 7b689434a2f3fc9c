"""The audit log: append-only, hash-chained records in one global order.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        # Copies of the record's fields, for queries; the record itself is the hashed line.
        sa.Column("at", sa.Text, nullable=False),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("hash", sa.Text, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )
    op.create_index("audit_tenant_seq", "audit", ["tenant", "seq"])
    op.create_index("audit_at", "audit", ["at"])


def downgrade() -> None:
    op.drop_table("audit")

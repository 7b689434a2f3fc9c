"""The first schema: API keys, and executions scoped by tenant.

Revision ID: 0001
Revises: none
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "executions",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("id", sa.Text, primary_key=True),
        # Insertion order, for "newest first": timestamps tie and clocks step back. PostgreSQL
        # numbers rows with the identity; SQLite has none, and the store numbers them there.
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("executions_seq", "executions", ["seq"], unique=True)
    op.create_index("executions_tenant_seq", "executions", ["tenant", "seq"])
    op.create_index("executions_status", "executions", ["status"])


def downgrade() -> None:
    op.drop_table("executions")
    op.drop_table("keys")

"""Proposals (checkpoints): remediations waiting for, or decided by, humans.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "proposals",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        # Every change bumps it; a change names the version it saw (compare-and-set).
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )
    op.create_index("proposals_seq", "proposals", ["seq"], unique=True)
    op.create_index("proposals_tenant_seq", "proposals", ["tenant", "seq"])
    op.create_index("proposals_state_expires", "proposals", ["state", "expires_at"])


def downgrade() -> None:
    op.drop_table("proposals")

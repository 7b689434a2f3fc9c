"""Interactive sandboxes, scoped by tenant; their ids are unique across tenants.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        # Unique across tenants: E2B's sandbox traffic names a sandbox by its id alone.
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("sandboxes_seq", "sandboxes", ["seq"], unique=True)
    op.create_index("sandboxes_tenant_seq", "sandboxes", ["tenant", "seq"])
    op.create_index("sandboxes_state", "sandboxes", ["state"])


def downgrade() -> None:
    op.drop_table("sandboxes")

"""Volumes: a tenant's named, persistent storage (its files are on the server's disk).

Sandboxes need no change: the volumes a sandbox mounts are in its JSON record.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        # Unique across tenants (as snapshot ids are): E2B names a volume by its id alone.
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("volumes_seq", "volumes", ["seq"], unique=True)
    # Names are unique per tenant: a concurrent second create of one name fails here.
    op.create_index("volumes_tenant_name", "volumes", ["tenant", "name"], unique=True)


def downgrade() -> None:
    op.drop_table("volumes")

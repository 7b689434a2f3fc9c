"""Keys get a name (who holds them), and can be revoked and rotated.

A revoked key stays in the table, for the record: ``revoked_at`` says since when it is
refused. ``rotated_at``: when its secret (digest) was last replaced.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("keys", sa.Column("name", sa.Text, nullable=False, server_default=""))
    op.add_column("keys", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("keys", sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for column in ("rotated_at", "revoked_at", "name"):
        op.drop_column("keys", column)

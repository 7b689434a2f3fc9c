"""Proposals keep no credential in clear: header values stored by older versions are removed.

A proposal's egress header values (brokered credentials) are now sealed under a key outside
the database, and its stored request holds markers in their place (service/credentials.py).
Before, a proposal kept them in clear in its record: this replaces each such value with
``<redacted>``. A proposal so scrubbed that is still pending can no longer be approved (its
values are gone): it must be proposed again, and the approval says so. On SQLite the freed
space is overwritten too (``secure_delete``); PostgreSQL keeps the old row versions until
its next ``VACUUM``.

Revision ID: 0007
Revises: 0006
"""

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_REDACTED = "<redacted>"
_MARKER = "<redacted hmac-sha256:"


def upgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("PRAGMA secure_delete = ON")
    proposals = sa.table("proposals", sa.column("id", sa.Text), sa.column("record", sa.Text))
    rows = connection.execute(
        sa.select(proposals.c.id, proposals.c.record).where(
            proposals.c.record.like('%"headers":{"%')  # only rules that set headers
        )
    ).all()
    for proposal_id, text in rows:
        record = json.loads(text)
        if _scrubbed(record):
            connection.execute(
                proposals.update()
                .where(proposals.c.id == proposal_id)
                .values(record=json.dumps(record, separators=(",", ":")))
            )


def _scrubbed(record: dict[str, Any]) -> bool:
    """Replace ``record``'s header values kept in clear; whether there were any."""
    if record.get("sealed_credentials"):
        return False
    network = (record.get("request") or {}).get("network") or {}
    changed = False
    for rule in network.get("rules") or []:
        headers = rule.get("headers") or {}
        for name, value in headers.items():
            if value != _REDACTED and not str(value).startswith(_MARKER):
                headers[name] = _REDACTED
                changed = True
    return changed


def downgrade() -> None:
    pass  # what was removed cannot come back

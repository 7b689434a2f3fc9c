"""Proposals in SQL: the ``proposals`` table (compare-and-set on ``version``)."""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ringfence.errors import StoreError
from ringfence.models import Proposal, ProposalState
from ringfence.store.sql._base import SqlBase
from ringfence.store.sql._schema import NEXT_PROPOSAL_SEQ, PROPOSALS

__all__ = ["SqlProposals"]


class SqlProposals(SqlBase):
    """The proposal methods of ``SqlStore``."""

    async def add_proposal(self, tenant: str, proposal: Proposal) -> None:
        """Record a new proposal.

        Raises:
            StoreError: a proposal with its id exists, or the database failed.
        """
        insert = PROPOSALS.insert().values(
            id=proposal.id,
            tenant=tenant,
            state=proposal.state.value,
            version=proposal.version,
            expires_at=proposal.expires_at,
            record=_proposal_record(proposal),
            owner=self.replica,
        )
        if self._engine.dialect.name == "sqlite":
            insert = insert.values(seq=NEXT_PROPOSAL_SEQ)
        async with self._transaction("adding a proposal") as connection:
            try:
                await connection.execute(insert)
            except IntegrityError as exc:
                raise StoreError(f"a proposal with id {proposal.id!r} exists") from exc

    async def get_proposal(self, tenant: str, proposal_id: str) -> Proposal | None:
        """The proposal, or None (also when it belongs to another tenant).

        Raises:
            StoreError: the database failed, or the stored proposal cannot be read.
        """
        query = sa.select(PROPOSALS).where(
            PROPOSALS.c.tenant == tenant, PROPOSALS.c.id == proposal_id
        )
        async with self._transaction("reading a proposal") as connection:
            row = (await connection.execute(query)).one_or_none()
        return None if row is None else self._proposal(row)

    async def list_proposals(
        self, tenant: str, *, states: Collection[ProposalState] | None = None, limit: int = 100
    ) -> list[Proposal]:
        """The tenant's proposals, newest first.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        query = sa.select(PROPOSALS).where(PROPOSALS.c.tenant == tenant)
        if states is not None:
            query = query.where(PROPOSALS.c.state.in_([state.value for state in states]))
        query = query.order_by(PROPOSALS.c.seq.desc()).limit(max(limit, 0))
        async with self._transaction("listing proposals") as connection:
            rows = (await connection.execute(query)).all()
        return [self._proposal(row) for row in rows]

    async def replace_proposal(self, tenant: str, proposal: Proposal) -> bool:
        """Store ``proposal`` if the stored one is still at ``proposal.version - 1``.

        Raises:
            StoreError: the database failed.
        """
        update = (
            PROPOSALS.update()
            .where(
                PROPOSALS.c.tenant == tenant,
                PROPOSALS.c.id == proposal.id,
                PROPOSALS.c.version == proposal.version - 1,
            )
            .values(
                state=proposal.state.value,
                version=proposal.version,
                expires_at=proposal.expires_at,
                record=_proposal_record(proposal),
                owner=self.replica,  # the replica that changes it runs what follows
            )
        )
        async with self._transaction("updating a proposal") as connection:
            updated = await connection.execute(update)
        return bool(updated.rowcount == 1)

    async def expired_proposals(self, now: datetime) -> list[tuple[str, Proposal]]:
        """Pending proposals whose approval window closed before ``now``.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        query = (
            sa.select(PROPOSALS)
            .where(
                PROPOSALS.c.state == ProposalState.PENDING.value,
                PROPOSALS.c.expires_at < now,
            )
            .order_by(PROPOSALS.c.seq)
        )
        async with self._transaction("finding expired proposals") as connection:
            rows = (await connection.execute(query)).all()
        return [(row.tenant, self._proposal(row)) for row in rows]

    async def unfinished_proposals(self) -> list[tuple[str, Proposal]]:
        """Proposals ``approved`` or ``executing``.

        Raises:
            StoreError: the database failed, or a stored proposal cannot be read.
        """
        running = [ProposalState.APPROVED.value, ProposalState.EXECUTING.value]
        query = sa.select(PROPOSALS).where(
            PROPOSALS.c.state.in_(running), self._gone(PROPOSALS.c.owner)
        )
        async with self._transaction("finding unfinished proposals") as connection:
            rows = (await connection.execute(query.order_by(PROPOSALS.c.seq))).all()
        return [(row.tenant, self._proposal(row)) for row in rows]

    def _proposal(self, row: sa.Row[Any]) -> Proposal:
        try:
            return Proposal.model_validate_json(row.record)
        except ValueError as exc:
            raise StoreError(
                f"{self._name}: proposal {row.id!r} of {row.tenant!r} cannot be read: {exc}"
            ) from exc


def _proposal_record(proposal: Proposal) -> str:
    """The proposal as stored: with its sealed credentials, which no dump carries."""
    record = proposal.model_dump(mode="json")
    if proposal.sealed_credentials is not None:
        record["sealed_credentials"] = proposal.sealed_credentials
    return json.dumps(record, separators=(",", ":"))

"""A database written by a Ringfence that kept proposals' header values in clear: opening it
removes them (migration 0007), and the proposal says it must be proposed again."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy.engine import make_url

import ringfence.store.migrations as migrations
from ringfence.models import (
    REDACTED,
    ExecutionRequest,
    NetworkPolicy,
    Proposal,
    ProposalState,
    Risk,
    request_digest,
)
from ringfence.store.sql import SqlStore

_BEFORE = "0006"  # the last revision that stored proposals' credentials in clear


def _old_database(url: str, record: str) -> None:
    """The database at ``_BEFORE``, holding one proposal whose record is ``record``."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    sync = parsed.set(drivername={"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}[backend])
    if backend == "sqlite":
        Path(parsed.database or "").parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    engine = sa.create_engine(sync, poolclass=sa.NullPool)
    try:
        with engine.begin() as connection:
            config = AlembicConfig()
            config.set_main_option("script_location", str(Path(migrations.__file__).parent))
            config.attributes["connection"] = connection
            command.upgrade(config, _BEFORE)
            connection.execute(
                sa.text(
                    "INSERT INTO proposals (id, tenant, seq, state, version, expires_at, record)"
                    " VALUES ('cp0123456789abcdef0123', 'acme', 1, 'pending', 0, :at, :record)"
                ),
                {"at": datetime.now(UTC) + timedelta(hours=1), "record": record},
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
async def test_an_upgrade_removes_credentials_older_versions_kept_in_clear(
    database: str, tmp_path: Path
) -> None:
    secret = "old-secret-" + secrets.token_hex(16)
    network = NetworkPolicy.model_validate(
        {"rules": [{"domain": "api.vendor.example", "headers": {"X-Api-Key": secret}},
                   {"domain": "pypi.org"}]}
    )  # fmt: skip
    request = ExecutionRequest(id="cp0123456789abcdef0123", command=["true"], network=network)
    now = datetime.now(UTC)
    old = Proposal(
        id=request.id, state=ProposalState.PENDING, request=request,
        digest=request_digest(request), rationale="r", risk=Risk.LOW, proposed_by="k",
        created_at=now, expires_at=now + timedelta(hours=1), required_approvals=1,
    )  # fmt: skip
    _old_database(database, old.model_dump_json())
    store = await SqlStore.open(database)
    try:
        upgraded = await store.get_proposal("acme", old.id)
    finally:
        await store.aclose()
    assert upgraded is not None and upgraded.request.network is not None
    rules = upgraded.request.network.rules
    assert rules[0].headers == {"X-Api-Key": REDACTED} and rules[1].headers == {}
    assert upgraded.model_copy(update={"request": old.request}) == old, "nothing else changed"
    if database.startswith("sqlite"):  # every byte of the files, freed pages included
        files = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
        assert secret.encode() not in files

"""``ringfence keys``: mint API keys, straight into the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from ringfence.cli._common import fail, settings
from ringfence.config import Config
from ringfence.errors import RingfenceError
from ringfence.store import Role

__all__ = ["keys"]


@click.group()
def keys() -> None:
    """Manage API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts for (a DNS label).")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=Role.AGENT.value,
    show_default=True,
    help="agent: run sandboxes; approver: also approve; admin: also keys.",
)
@click.option("--description", default="", help="What the key is for.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="As for 'ringfence serve'.")
@click.option("--database-url", help="As for 'ringfence serve'.")
def create(
    tenant: str, role: str, description: str, data_dir: Path | None, database_url: str | None
) -> None:
    """Create a key and print it. It is shown this once: only a digest is stored."""
    config = settings(data_dir=data_dir, database_url=database_url)
    try:
        key = asyncio.run(_create(config, tenant, Role(role), description))
    except RingfenceError as exc:
        fail(exc.message, 2 if exc.code == "invalid_request" else 1)
    click.echo(key)


async def _create(config: Config, tenant: str, role: Role, description: str) -> str:
    from ringfence.service.keys import mint_key
    from ringfence.store.factory import open_store

    store = await open_store(config)
    try:
        return await mint_key(store, tenant, role, description)
    finally:
        await store.aclose()

"""``ringfence keys``: create, list, revoke and rotate API keys, straight in the store
(opened through ``ringfence.compose.open_offline``).

These act on the host, as the operator, like ``ringfence serve`` (``--data-dir``,
``--database-url``): no key is needed, so a leaked admin key can be revoked even when it is
the only one. A tenant's admin does the same remotely through ``/v1/keys``. Keys are shown
in clear only by ``create`` and ``rotate``, once; ``list`` never shows a secret. A running
server (every replica) refuses a revoked or rotated-out key within 2 s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ringfence.cli._common import fail, settings
from ringfence.errors import RingfenceError
from ringfence.models import Role

if TYPE_CHECKING:
    from ringfence.models import ApiKey
    from ringfence.service.keys import Keys

__all__ = ["keys"]

_T = TypeVar("_T")


@click.group()
def keys() -> None:
    """Manage API keys (on this host, as the operator)."""


def _store_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--database-url", help="As for 'ringfence serve'.")(command)
    return click.option(
        "--data-dir", type=click.Path(path_type=Path), help="As for 'ringfence serve'."
    )(command)


def _run(
    data_dir: Path | None, database_url: str | None, action: Callable[[Keys], Awaitable[_T]]
) -> _T:
    """Run ``action`` on the store's keys; a Ringfence error is one line on stderr (exit 2
    for bad input, 1 otherwise)."""
    config = settings(data_dir=data_dir, database_url=database_url)

    async def on_store() -> _T:
        from ringfence.compose import open_offline

        async with open_offline(config) as offline:
            return await action(offline.keys)

    try:
        return asyncio.run(on_store())
    except RingfenceError as exc:
        fail(exc.message, 2 if exc.code == "invalid_request" else 1)


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts for (a DNS label).")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=Role.AGENT.value,
    show_default=True,
    help="agent: run sandboxes; approver: also approve; admin: also keys.",
)
@click.option("--name", default="", help="Who or what holds it (shown in the console, audit).")
@click.option("--description", default="", help="What the key is for.")
@_store_options
def create(
    tenant: str,
    role: str,
    name: str,
    description: str,
    data_dir: Path | None,
    database_url: str | None,
) -> None:
    """Create a key and print it. It is shown this once: only a digest is stored."""
    key = _run(
        data_dir, database_url, lambda keys: keys.mint(tenant, Role(role), description, name)
    )
    click.echo(key)


@keys.command("list")
@click.option("--tenant", help="Only this tenant's keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
@_store_options
def list_(
    tenant: str | None, as_json: bool, data_dir: Path | None, database_url: str | None
) -> None:
    """Every key (revoked ones too), oldest first; never a secret."""
    found = _run(data_dir, database_url, lambda keys: keys.list_for(tenant))
    if as_json:
        click.echo(json.dumps([_json(k) for k in found], indent=2))
        return
    rows = [("ID", "TENANT", "ROLE", "NAME", "CREATED", "STATE")]
    for key in found:
        state = f"revoked {_when(key.revoked_at)}" if key.revoked_at else "valid"
        rows.append((key.key_id, key.tenant, key.role.value, key.name or "-",
                     _when(key.created_at), state))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@keys.command("revoke")
@click.argument("key_id")
@_store_options
def revoke(key_id: str, data_dir: Path | None, database_url: str | None) -> None:
    """Revoke a key for good (the id from 'keys list', or rf_<id>_...)."""
    from ringfence.service.keys import OPERATOR

    key = _run(data_dir, database_url, lambda keys: keys.revoke(_id(key_id), OPERATOR))
    click.echo(f"revoked {key.key_id} ({key.name or 'no name'}, tenant {key.tenant})", err=True)


@keys.command("rotate")
@click.argument("key_id")
@_store_options
def rotate(key_id: str, data_dir: Path | None, database_url: str | None) -> None:
    """Give a key a new secret and print the new key (shown this once); the old one is
    refused from now on. The id, name and role stay."""
    from ringfence.service.keys import OPERATOR

    _, key = _run(data_dir, database_url, lambda keys: keys.rotate(_id(key_id), OPERATOR))
    click.echo(key)


def _id(given: str) -> str:
    """A key id, also from a whole key pasted by mistake (its secret is not used)."""
    return given.split("_")[1] if given.startswith("rf_") and given.count("_") >= 2 else given


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _json(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.key_id, "tenant": key.tenant, "role": key.role.value, "name": key.name,
        "description": key.description, "created_at": key.created_at.isoformat(),
        "rotated_at": key.rotated_at.isoformat() if key.rotated_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }  # fmt: skip

"""``ringfence doctor``: which isolation layers this host supports, and how to fix gaps."""

from __future__ import annotations

import json
import sys

import click

from ringfence.config import Config

__all__ = ["doctor"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> None:
    """Check every isolation layer of the local backend on this host.

    Exits 0 when all are present (the local backend will start), 1 otherwise.
    """
    from ringfence.backends.local.probe import check_host

    checks, host = check_host(Config())
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        width = max(len(c.layer) for c in checks)
        for check in checks:
            mark = "ok     " if check.ok else "MISSING"
            click.echo(f"{mark}  {check.layer:<{width}}  {check.detail}")
            if check.fix:
                click.echo(f"         {'':<{width}}  fix: {check.fix}")
        if host is not None:
            click.echo("\nThe local backend can run sandboxes with every isolation layer.")
        else:
            click.echo("\nThe local backend will refuse to start until the gaps above are fixed.")
    sys.exit(0 if host is not None else 1)

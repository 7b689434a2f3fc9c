"""``ringfence volume``: your volumes (named, persistent storage with a quota) and their
files, through the SDK. Mount one with ``ringfence sandbox create --volume NAME:PATH``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import BinaryIO

import click

from ringfence.cli.sandbox import api_options, client_errors, when
from ringfence.models import Volume

__all__ = ["volume"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group()
def volume() -> None:
    """Your volumes: they outlive every sandbox that mounts them (and the server).

    \b
    Example (a file kept across two sandboxes):
      ringfence volume create data --quota 512M
      ringfence sandbox create --volume data:/mnt/data
      ringfence volume get data results.csv > results.csv
    """


def _line(found: Volume) -> str:
    used = "" if found.used_bytes is None else f"  {found.used_bytes} used"
    return f"{found.id}  {found.name}  {found.quota_bytes} bytes{used}  {when(found.created_at)}"


@volume.command("create")
@click.argument("name")
@click.option("--quota", help="Bytes it may hold, e.g. 512M [default: the server's, 1G].")
@_JSON
@api_options
def create(
    name: str, quota: str | None, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """Create a volume; print its id."""
    from ringfence._units import parse_size
    from ringfence.client import Ringfence

    try:
        quota_bytes = None if quota is None else parse_size(quota)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--quota") from None
    with client_errors(), Ringfence(url, api_key) as rf:
        made = rf.volumes.create(name, quota_bytes=quota_bytes)
    click.echo(made.model_dump_json(indent=2) if as_json else made.id)


@volume.command("list")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@_JSON
@api_options
def list_volumes(limit: int, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Your volumes, newest first."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        found = rf.volumes.list(limit=limit)
    if as_json:
        click.echo(json.dumps([v.model_dump(mode="json") for v in found], indent=2))
        return
    for each in found:
        click.echo(_line(each))


@volume.command("info")
@click.argument("name")
@_JSON
@api_options
def info(name: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """A volume (by name or id), with the bytes it uses."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        found = rf.volumes.get(name)
    click.echo(found.model_dump_json(indent=2) if as_json else _line(found))


@volume.command("rm")
@click.argument("name")
@api_options
def remove(name: str, url: str | None, api_key: str | None) -> None:
    """Delete a volume and every file in it (refused while a sandbox mounts it)."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        rf.volumes.delete(name)
    click.echo(f"{name} deleted")


@volume.command("put")
@click.argument("name")
@click.argument("path")
@click.argument("source", default="-", type=click.File("rb"))
@api_options
def put(name: str, path: str, source: BinaryIO, url: str | None, api_key: str | None) -> None:
    """Write SOURCE (a local file, or - for stdin) to PATH in the volume."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        written = rf.volumes.write_file(name, path, source.read())
    click.echo(written.path)


@volume.command("get")
@click.argument("name")
@click.argument("path")
@api_options
def get(name: str, path: str, url: str | None, api_key: str | None) -> None:
    """Print a file of the volume (its bytes, on stdout)."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        data = rf.volumes.read_file(name, path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@volume.command("ls")
@click.argument("name")
@click.argument("path", default="/")
@click.option("--depth", default=1, show_default=True, type=click.IntRange(1, 16))
@_JSON
@api_options
def ls(
    name: str, path: str, depth: int, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """List a directory of the volume (PATH defaults to its root)."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        entries = rf.volumes.list_dir(name, path, depth=depth)
    if as_json:
        click.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    for e in entries:
        kind = {"directory": "/", "symlink": "@"}.get(e.type, "")
        click.echo(f"{e.mode:04o}  {e.uid:>5}  {e.size:>10}  {when(e.mtime)}  {e.path}{kind}")


@volume.command("tar")
@click.argument("name")
@click.argument("path", default="/")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
    help="The archive to write (a tar file).",
)  # fmt: skip
@api_options
def tar(name: str, path: str, output: Path, url: str | None, api_key: str | None) -> None:
    """Download a directory of the volume (PATH defaults to its root) as a tar archive,
    streamed: directories, files and symlinks (as links)."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        size = rf.volumes.download_archive(name, path, output)
    click.echo(f"{output} ({size} bytes)")

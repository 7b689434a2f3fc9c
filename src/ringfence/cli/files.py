"""``ringfence files``: read, write and list files in a sandbox, streamed, through the SDK."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

import click

from ringfence.cli.sandbox import api_options, client_errors

__all__ = ["files"]


@click.group()
def files() -> None:
    """Files in an interactive sandbox (relative paths start at /home/user)."""


@files.command("read")
@click.argument("sandbox_id")
@click.argument("path")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write it here."
)
@api_options
def read(
    sandbox_id: str, path: str, output: Path | None, url: str | None, api_key: str | None
) -> None:
    """Print a file's bytes (or save them with -o), streamed."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            if output is not None:
                sbx.files.download(path, output)
            else:
                for chunk in sbx.files.read_stream(path):
                    sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
        finally:
            sbx.close()


@files.command("archive")
@click.argument("sandbox_id")
@click.argument("path", default=".")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
    help="Write the tar archive here (default: stdout).",
)  # fmt: skip
@click.option(
    "-x", "--extract", "extract_to", type=click.Path(file_okay=False, path_type=Path),
    help="Extract it into this directory instead (made if missing; must be empty), refusing "
    "entries that would land outside it.",
)  # fmt: skip
@api_options
def archive(
    sandbox_id: str,
    path: str,
    output: Path | None,
    extract_to: Path | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Download the directory PATH (default: the home) as a tar archive, streamed: to
    stdout, a file (-o), or extracted (-x). Symbolic links stay links; fifos, sockets and
    devices are left out."""
    from ringfence.client import Sandbox

    if output is not None and extract_to is not None:
        raise click.UsageError("give -o or -x, not both")
    if output is None and extract_to is None and sys.stdout.isatty():
        raise click.UsageError("stdout is a terminal: give -o FILE or -x DIR (or pipe it)")
    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            if extract_to is not None:
                click.echo(sbx.files.download_dir(path, extract_to))
                return
            if output is not None:
                with output.open("wb") as sink:
                    for chunk in sbx.files.read_archive(path):
                        sink.write(chunk)
                return
            for chunk in sbx.files.read_archive(path):
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        finally:
            sbx.close()


@files.command("write")
@click.argument("sandbox_id")
@click.argument("path")
@click.argument("source", default="-", type=click.File("rb"))
@api_options
def write(
    sandbox_id: str, path: str, source: BinaryIO, url: str | None, api_key: str | None
) -> None:
    """Write SOURCE (a local file, or - for stdin) to PATH in the sandbox, streamed."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            info = sbx.files.write(path, source)
        finally:
            sbx.close()
    click.echo(info.path)


@files.command("ls")
@click.argument("sandbox_id")
@click.argument("path", default=".")
@click.option("--depth", default=1, show_default=True, type=click.IntRange(1, 64))
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@api_options
def ls(
    sandbox_id: str, path: str, depth: int, as_json: bool, url: str | None, api_key: str | None
) -> None:
    """List a directory (PATH defaults to the home directory)."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            entries = sbx.files.list(path, depth)
        finally:
            sbx.close()
    if as_json:
        records = [{**asdict(e), "modified_time": e.modified_time.isoformat()} for e in entries]
        click.echo(json.dumps(records, indent=2))
        return
    for e in entries:
        when = e.modified_time.strftime("%Y-%m-%d %H:%M")
        kind = "/" if e.type == "dir" else ("@" if e.is_symlink else "")
        click.echo(f"{e.permissions}  {e.owner:<8} {e.size:>10}  {when}  {e.path}{kind}")

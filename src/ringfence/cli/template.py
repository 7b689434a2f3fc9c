"""``ringfence template``: build, import, list and remove sandbox templates on this host.

Templates live in the templates directory (the data directory's sibling
``ringfence-templates``; ``/var/lib/ringfence-templates`` for root). Errors are one line on
stderr: exit 2 for bad input (a bad name or archive), 1 otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from ringfence.cli._common import fail, settings
from ringfence.errors import RingfenceError

__all__ = ["template"]

_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="As for 'ringfence serve'; templates live in its sibling 'ringfence-templates'.",
)


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except RingfenceError as exc:
        fail(exc.message, 2 if exc.code == "invalid_request" else 1)


@click.group()
def template() -> None:
    """Manage templates: the root filesystems sandboxes start from."""


@template.command("build")
@click.argument("name")
@click.option(
    "--recipe",
    type=click.Choice(["minbase", "base", "code-interpreter", "dev", "browser"]),
    help="Packages to start from (minbase: none beyond debootstrap's minbase; dev: git, gh, "
    "Python with pip and uv, Node.js with npm, Go, build-essential; browser: Chromium, "
    "fonts and the Markdown converter, docs/browser.md) "
    "[default: the recipe named NAME if there is one, else base].",
)
@click.option("--packages", default="", help="More Debian packages, comma-separated.")
@click.option("--suite", default="bookworm", show_default=True, help="The Debian release.")
@click.option("--mirror", help="Debian archive URL [default: the one this host's apt uses].")
@click.option("--replace", is_flag=True, help="Replace a template of that name.")
@_DATA_DIR
def build(
    name: str,
    recipe: str | None,
    packages: str,
    suite: str,
    mirror: str | None,
    replace: bool,
    data_dir: Path | None,
) -> None:
    """Build template NAME from Debian packages with debootstrap (as root)."""
    from ringfence.templates import Registry
    from ringfence.templates.build import PYPI_RECIPES, RECIPES, build_template

    if recipe is None:
        recipe = name if name in RECIPES else "base"
    wanted = list(dict.fromkeys([*RECIPES[recipe], *filter(None, packages.split(","))]))
    started = time.monotonic()
    with _errors():
        built = build_template(
            Registry.for_config(settings(data_dir=data_dir)),
            name,
            [p.strip() for p in wanted],
            recipe=recipe,
            suite=suite,
            mirror=mirror,
            on_progress=lambda line: click.echo(line, err=True),
            replace=replace,
            pypi=PYPI_RECIPES.get(recipe, ()),
        )
    seconds = time.monotonic() - started
    click.echo(f"built template {name}: {_size(built.metadata)}, {seconds:.0f} s, {built.rootfs}")


@template.command("import")
@click.argument("name")
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("--replace", is_flag=True, help="Replace a template of that name.")
@_DATA_DIR
def import_(name: str, archive: Path, replace: bool, data_dir: Path | None) -> None:
    """Import template NAME from a 'docker save' archive (or an OCI layout in a tar)."""
    from ringfence.templates import import_template

    with _errors():
        imported = import_template(settings(data_dir=data_dir), name, archive, replace=replace)
    skipped = imported.metadata.get("skipped_devices", 0)
    note = f", {skipped} device nodes skipped" if skipped else ""
    click.echo(f"imported template {name}: {_size(imported.metadata)}{note}, {imported.rootfs}")


@template.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of the metadata.")
@_DATA_DIR
def list_(as_json: bool, data_dir: Path | None) -> None:
    """List the templates on this host."""
    from ringfence.templates import Registry

    with _errors():
        found = Registry.for_config(settings(data_dir=data_dir)).list()
    if as_json:
        click.echo(json.dumps([{**t.metadata, "rootfs": str(t.rootfs)} for t in found]))
        return
    click.echo(f"{'NAME':<24} {'SOURCE':<8} {'SIZE':>9}  CREATED")
    for t in found:
        source = str(t.metadata.get("recipe") or t.metadata.get("source", "?"))
        created = t.metadata.get("created", "?")
        click.echo(f"{t.name:<24} {source:<8} {_size(t.metadata):>9}  {created}")


@template.command("rm")
@click.argument("name")
@_DATA_DIR
def rm(name: str, data_dir: Path | None) -> None:
    """Remove template NAME (sandboxes still running from it lose its files)."""
    from ringfence.templates import Registry

    with _errors():
        Registry.for_config(settings(data_dir=data_dir)).remove(name)
    click.echo(f"removed template {name}")


def _size(metadata: dict[str, object]) -> str:
    size = metadata.get("size_bytes")
    return f"{size / (1 << 20):.0f} MiB" if isinstance(size, int) else "?"

"""``ringfence sandbox checkpoint|checkpoints|rollback|delete-checkpoint|pause|resume|fork``
and ``ringfence sandbox snapshot create|list|delete``: a sandbox's state, through the SDK
(docs/state.md). Errors are one line on stderr and a non-zero exit (2 for bad input), as
for every ``ringfence sandbox`` command."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ringfence.cli.sandbox import api_options, client_errors, when
from ringfence.models import MAX_FORK_CHILDREN

if TYPE_CHECKING:
    from ringfence.client import Sandbox

__all__ = ["COMMANDS"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print the record(s) as JSON.")


@contextmanager
def _connected(
    sandbox_id: str, url: str | None, api_key: str | None, *, resume: bool = True
) -> Iterator[Sandbox]:
    """A handle on the sandbox, closed (never killed) at the end; SDK errors as one line."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, resume=resume, url=url, api_key=api_key)
        try:
            yield sbx
        finally:
            sbx.close()


@click.command("checkpoint")
@click.argument("sandbox_id")
@_JSON
@api_options
def checkpoint(sandbox_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Checkpoint a sandbox's files (its processes keep running); print the checkpoint id."""
    with _connected(sandbox_id, url, api_key) as sbx:
        made = sbx.checkpoint()
    click.echo(made.model_dump_json(indent=2) if as_json else made.id)


@click.command("checkpoints")
@click.argument("sandbox_id")
@_JSON
@api_options
def checkpoints(sandbox_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """A sandbox's checkpoints, oldest first."""
    with _connected(sandbox_id, url, api_key) as sbx:
        found = sbx.checkpoints()
    if as_json:
        click.echo(json.dumps([c.model_dump(mode="json") for c in found], indent=2))
        return
    for c in found:
        click.echo(f"{c.id}  {when(c.created_at)}  {c.files} entries  {c.bytes} bytes")


@click.command("rollback")
@click.argument("sandbox_id")
@click.argument("checkpoint_id")
@api_options
def rollback(sandbox_id: str, checkpoint_id: str, url: str | None, api_key: str | None) -> None:
    """Restore a sandbox's files to CHECKPOINT_ID in place (its processes keep running)."""
    with _connected(sandbox_id, url, api_key) as sbx:
        sbx.rollback(checkpoint_id)
    click.echo(f"{sandbox_id} rolled back to {checkpoint_id}")


@click.command("delete-checkpoint")
@click.argument("sandbox_id")
@click.argument("checkpoint_id")
@api_options
def delete_checkpoint(
    sandbox_id: str, checkpoint_id: str, url: str | None, api_key: str | None
) -> None:
    """Free a checkpoint of a sandbox."""
    with _connected(sandbox_id, url, api_key) as sbx:
        sbx.delete_checkpoint(checkpoint_id)
    click.echo(f"{checkpoint_id} deleted")


@click.command("pause")
@click.argument("sandbox_id")
@click.option(
    "--memory/--no-memory", default=False, show_default=True,
    help="Keep its memory (processes frozen where they are) instead of saving its files "
    "and freeing everything (processes restart on resume).",
)  # fmt: skip
@api_options
def pause(sandbox_id: str, memory: bool, url: str | None, api_key: str | None) -> None:
    """Pause a sandbox; any request to it (or 'sandbox resume') resumes it."""
    with _connected(sandbox_id, url, api_key, resume=False) as sbx:
        paused = sbx.pause(memory=memory)
    kept = "memory kept" if paused.memory else "files kept, memory freed"
    click.echo(f"{sandbox_id} paused ({kept})")


@click.command("resume")
@click.argument("sandbox_id")
@api_options
def resume(sandbox_id: str, url: str | None, api_key: str | None) -> None:
    """Resume a paused sandbox under the same id."""
    with _connected(sandbox_id, url, api_key, resume=False) as sbx:
        info = sbx.resume()
    click.echo(f"{info.id} {info.state.value}")


@click.command("fork")
@click.argument("sandbox_id")
@click.option(
    "-n", "--count", default=1, show_default=True, type=click.IntRange(1, MAX_FORK_CHILDREN),
    help="How many children.",
)  # fmt: skip
@api_options
def fork(sandbox_id: str, count: int, url: str | None, api_key: str | None) -> None:
    """Start COUNT new sandboxes from one checkpoint of a sandbox's files; print their ids."""
    with _connected(sandbox_id, url, api_key) as sbx:
        children = sbx.fork(count)
        for child in children:
            click.echo(child.id)
            child.close()


@click.group("snapshot")
def snapshot() -> None:
    """Snapshots: a sandbox's files kept on the server, to start new sandboxes from
    ('sandbox create --snapshot ID')."""


@snapshot.command("create")
@click.argument("sandbox_id")
@_JSON
@api_options
def snapshot_create(sandbox_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Persist a sandbox's files as a snapshot; print its id."""
    with _connected(sandbox_id, url, api_key) as sbx:
        made = sbx.snapshot()
    click.echo(made.model_dump_json(indent=2) if as_json else made.id)


@snapshot.command("list")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@_JSON
@api_options
def snapshot_list(limit: int, as_json: bool, url: str | None, api_key: str | None) -> None:
    """Your snapshots, newest first."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        found = rf.sandboxes.list_snapshots(limit=limit)
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return
    for s in found:
        made = when(s.created_at)
        click.echo(f"{s.id}  {made}  of {s.sandbox_id}  {s.template}  {s.bytes} bytes")


@snapshot.command("delete")
@click.argument("snapshot_id")
@api_options
def snapshot_delete(snapshot_id: str, url: str | None, api_key: str | None) -> None:
    """Delete a snapshot (sandboxes started from it keep their files)."""
    from ringfence.client import Ringfence

    with client_errors(), Ringfence(url, api_key) as rf:
        rf.sandboxes.delete_snapshot(snapshot_id)
    click.echo(f"{snapshot_id} deleted")


# What ``ringfence sandbox`` gains (``ringfence.cli`` adds them to the group).
COMMANDS = [checkpoint, checkpoints, rollback, delete_checkpoint, pause, resume, fork, snapshot]

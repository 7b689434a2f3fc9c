"""``ringfence sandbox``: interactive sandboxes on a Ringfence server, through the SDK.

The server is ``--url`` / ``--api-key``, else ``RINGFENCE_URL`` / ``RINGFENCE_API_KEY``.
Errors are one line on stderr: exit 2 for bad input, 1 otherwise (``exec``: 125).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import IO, Any, TypeVar

import click

from ringfence.cli._common import fail
from ringfence.cli._network_options import network_options, policy_from_options, read_policy

__all__ = ["api_options", "client_errors", "sandbox", "when"]

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_FAILED = 125  # Ringfence failed, not the command (as docker exec)
EXIT_INTERRUPTED = 130

F = TypeVar("F", bound=Callable[..., Any])


def api_options(function: F) -> F:
    """``--url`` and ``--api-key``, passed on as ``url`` and ``api_key``."""
    function = click.option(
        "--api-key", envvar="RINGFENCE_API_KEY", show_envvar=True, help="Your API key."
    )(function)
    return click.option(
        "--url",
        envvar="RINGFENCE_URL",
        show_envvar=True,
        help="The server [default: http://127.0.0.1:8080].",
    )(function)


@contextmanager
def client_errors(failure_code: int = 1) -> Iterator[None]:
    """SDK errors as one line on stderr and an exit status, never a traceback."""
    from ringfence.errors import RingfenceError

    try:
        yield
    except RingfenceError as exc:
        fail(exc.message, 2 if exc.code == "invalid_request" else failure_code)
    except KeyboardInterrupt:
        fail("interrupted", EXIT_INTERRUPTED)


def _pairs(items: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


@click.group()
def sandbox() -> None:
    """Create, list and kill interactive sandboxes; run commands in them; checkpoint,
    roll back, pause, resume, fork and snapshot them; diff and sync their project view."""


@sandbox.command("create")
@click.option("--template", default="base", show_default=True, help="Root filesystem.")
@click.option("--timeout", type=float, help="Seconds until it is killed [default: 300].")
@click.option("--env", "env_items", multiple=True, metavar="K=V", help="For every command.")
@click.option("--metadata", "metadata_items", multiple=True, metavar="K=V", help="Your labels.")
@click.option("--memory", help="Memory limit of the whole sandbox, e.g. 512M.")
@click.option("--pids", type=int, help="Most processes and threads at once.")
@click.option("--cpus", type=float, help="CPU limit in cores, e.g. 0.5.")
@click.option("--disk", help="Size of each writable filesystem, e.g. 256M.")
@network_options
@click.option("--snapshot", help="Start from this snapshot of yours (its files, its template).")
@click.option("--auto-pause", type=float, metavar="SECONDS", help="Pause it to disk when idle.")
@click.option(
    "--on-timeout", type=click.Choice(["kill", "pause"]), default="kill", show_default=True,
    help="What its timeout does.",
)  # fmt: skip
@click.option(
    "--auto-resume/--no-auto-resume", default=True, show_default=True,
    help="Whether a request to it while paused resumes it.",
)  # fmt: skip
@click.option(
    "--project", "project_dir", type=click.Path(file_okay=False), metavar="DIR",
    help="Show this directory of the server's host (under its project roots) as a "
    "copy-on-write view: 'sandbox diff' shows the sandbox's changes, 'sandbox sync' applies "
    "them.",
)  # fmt: skip
@click.option(
    "--project-path", default="/home/user/project", show_default=True, metavar="PATH",
    help="Where the sandbox sees --project.",
)  # fmt: skip
@click.option(
    "--volume", "volume_items", multiple=True, metavar="NAME:PATH[:ro]",
    help="Mount a volume of yours at PATH (read-only with :ro); see 'ringfence volume'.",
)  # fmt: skip
@click.option(
    "--public-traffic", is_flag=True,
    help="Let anyone with a preview URL of it reach its ports, without a key.",
)  # fmt: skip
@click.option(
    "--group", metavar="NAME",
    help="Put it in this network group of yours: its members reach each other's ports "
    "through $RINGFENCE_GROUP_PROXY inside (curl -x \"$RINGFENCE_GROUP_PROXY\" "
    "http://PEER_ID:PORT/).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as JSON.")
@api_options
def create(
    template: str,
    timeout: float | None,
    env_items: tuple[str, ...],
    metadata_items: tuple[str, ...],
    memory: str | None,
    pids: int | None,
    cpus: float | None,
    disk: str | None,
    allow_domains: tuple[str, ...],
    deny_domains: tuple[str, ...],
    network_file: IO[str] | None,
    snapshot: str | None,
    auto_pause: float | None,
    on_timeout: str,
    auto_resume: bool,
    project_dir: str | None,
    project_path: str,
    volume_items: tuple[str, ...],
    public_traffic: bool,
    group: str | None,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Create a sandbox and print its id. It runs until its timeout or 'sandbox kill'.

    \b
    Example (pip works inside, nothing else is reachable):
      ringfence sandbox create --allow-domain pypi.org --allow-domain files.pythonhosted.org
    
    Example (an agent works on a copy of ./repo; review, then apply):
      ringfence sandbox create --project ./repo
    """
    from ringfence.client import Sandbox

    limits = {
        name: value
        for name, value in {"memory": memory, "pids": pids, "cpus": cpus, "disk": disk}.items()
        if value is not None
    }
    env, metadata = _pairs(env_items, "--env"), _pairs(metadata_items, "--metadata")
    network = policy_from_options(allow_domains, deny_domains, network_file)
    with client_errors():
        project = None
        if project_dir is not None:  # a relative DIR is the caller's, resolved here
            project = {"source": os.path.abspath(project_dir), "path": project_path}
        sbx = Sandbox.create(
            template, timeout=timeout, env=env, metadata=metadata, limits=limits,
            network=network, snapshot=snapshot, auto_pause=auto_pause, on_timeout=on_timeout,
            auto_resume=auto_resume, project=project, volumes=_volumes(volume_items),
            public_traffic=public_traffic, group=group, url=url, api_key=api_key,
        )  # fmt: skip
        info = sbx.info()
        sbx.close()
    click.echo(info.model_dump_json(indent=2) if as_json else info.id)


@sandbox.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["running", "paused", "killed", "expired", "failed"]),
    help="Only in this state (repeatable).",
)
@click.option("--metadata", "metadata_items", multiple=True, metavar="K=V", help="Only with it.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
@api_options
def list_(
    states: tuple[str, ...],
    metadata_items: tuple[str, ...],
    limit: int,
    as_json: bool,
    url: str | None,
    api_key: str | None,
) -> None:
    """Your sandboxes, newest first."""
    from ringfence.client import Sandbox

    metadata = _pairs(metadata_items, "--metadata")
    with client_errors():
        found = Sandbox.list(
            state=list(states), metadata=metadata, limit=limit, url=url, api_key=api_key
        )
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return
    rows = [("ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES", "METADATA")]
    for s in found:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.metadata.items()))
        rows.append(
            (s.id, s.state.value, s.template, when(s.created_at), when(s.expires_at), labels)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _volumes(items: tuple[str, ...]) -> list[dict[str, object]]:
    """``--volume NAME:PATH[:ro]`` as the SDK's mounts. Raises ``click.BadParameter``."""
    mounts: list[dict[str, object]] = []
    for item in items:
        name, _, rest = item.partition(":")
        path, _, mode = rest.partition(":")
        if not name or not path or mode not in ("", "ro", "rw"):
            raise click.BadParameter(
                f"{item!r}: expected NAME:PATH or NAME:PATH:ro", param_hint="--volume"
            )
        mounts.append({"name": name, "path": path, "read_only": mode == "ro"})
    return mounts


def when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


@sandbox.command("kill")
@click.argument("sandbox_id")
@api_options
def kill(sandbox_id: str, url: str | None, api_key: str | None) -> None:
    """Kill a sandbox: every process, and everything it wrote."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, resume=False, url=url, api_key=api_key)
        info = sbx.kill()
        sbx.close()
    click.echo(f"{info.id} {info.state.value}")


@sandbox.command("url")
@click.argument("sandbox_id")
@click.argument("port", type=click.IntRange(1, 65535))
@api_options
def url_(sandbox_id: str, port: int, url: str | None, api_key: str | None) -> None:
    """Print the preview URL of PORT: where a server the sandbox runs on that port is
    reached from outside (send your key as 'Authorization: Bearer', unless the sandbox was
    created with --public-traffic). A server with a preview domain also answers at
    PORT-SANDBOX_ID.DOMAIN (docs/ports.md).

    \b
    Example:
      ringfence sandbox exec ID -- sh -c 'python3 -m http.server 8000 &'
      curl -H "Authorization: Bearer $RINGFENCE_API_KEY" "$(ringfence sandbox url ID 8000)"
    """
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, resume=False, url=url, api_key=api_key)
        shown = sbx.get_url(port)
        sbx.close()
    click.echo(shown)


@sandbox.command("set-timeout")
@click.argument("sandbox_id")
@click.argument("seconds", type=float)
@api_options
def set_timeout(sandbox_id: str, seconds: float, url: str | None, api_key: str | None) -> None:
    """Kill the sandbox SECONDS from now (sooner or later than before)."""
    from ringfence.client import Sandbox

    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        info = sbx.set_timeout(seconds)
        sbx.close()
    expires = info.expires_at.isoformat() if info.expires_at else "-"
    click.echo(f"{info.id} expires at {expires}")


@sandbox.command("network")
@click.argument("sandbox_id")
@click.option(
    "--set",
    "new_policy",
    type=click.File("r"),
    metavar="FILE.json",
    help="Replace the policy with this one ('-': stdin); connections opened from then on "
    "follow it.",
)
@api_options
def network(
    sandbox_id: str, new_policy: IO[str] | None, url: str | None, api_key: str | None
) -> None:
    """Print the sandbox's egress policy as JSON (header values redacted), or replace it.

    \b
    Example:
      echo '{"rules": [{"domain": "pypi.org"}]}' | ringfence sandbox network sb123 --set -
    """
    from ringfence.client import Sandbox

    policy = None if new_policy is None else read_policy(new_policy)
    with client_errors():
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        try:
            shown = sbx.get_network() if policy is None else sbx.set_network(policy)
        finally:
            sbx.close()
    click.echo(shown.model_dump_json(indent=2))


@sandbox.command("exec")
@click.argument("sandbox_id")
@click.option("--cwd", help="Working directory [default: /home/user].")
@click.option("--env", "env_items", multiple=True, metavar="K=V", help="Set a variable.")
@click.option("--timeout", type=float, help="Kill the command after this many seconds.")
@api_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    sandbox_id: str,
    cwd: str | None,
    env_items: tuple[str, ...],
    timeout: float | None,
    url: str | None,
    api_key: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (an argv, no shell; put it after --) in a sandbox, streaming its output.

    Exits with the command's status; 124 when it hit --timeout; 125 when Ringfence failed;
    130 when interrupted (the command is killed).

    \b
    Example:
      ringfence sandbox exec sb123 -- bash -lc 'ls | wc -l'
    """
    from ringfence.client import CommandTimeout, Sandbox

    env = _pairs(env_items, "--env")

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    with client_errors(EXIT_FAILED):
        sbx = Sandbox.connect(sandbox_id, url=url, api_key=api_key)
        handle = sbx.commands.run(
            list(command), background=True, envs=env, cwd=cwd, timeout=timeout,
            on_stdout=out, on_stderr=err,
        )  # fmt: skip
        try:
            result = handle.wait()
        except CommandTimeout as exc:
            fail(exc.message, EXIT_TIMEOUT)
        except KeyboardInterrupt:
            handle.kill()
            fail("interrupted; the command was killed", EXIT_INTERRUPTED)
        finally:
            sbx.close()
    if result.error:
        click.echo(f"ringfence: {result.error}", err=True)
    code = result.exit_code
    sys.exit(code if 0 <= code <= 255 else EXIT_FAILED)

"""``ringfence exec``: run one command in a fresh sandbox."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import IO

import click
from pydantic import ValidationError

from ringfence.backends import BACKENDS, Executor, create_executor
from ringfence.cli._common import fail, settings, validation_message
from ringfence.cli._network_options import network_options, policy_from_options
from ringfence.errors import BackendUnavailable, RingfenceError, UnknownBackend
from ringfence.models import ExecutionRequest, ExecutionResult, Mount, ResourceLimits, Status

__all__ = ["exec_command", "exit_code_for"]

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_RINGFENCE_FAILED = 125  # the sandbox itself failed, as timeout(1) and docker run
EXIT_INTERRUPTED = 130


@click.command(
    "exec",
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option(
    "--backend",
    type=click.Choice(sorted(BACKENDS)),
    help="Backend to run on [default: $SANDBOX_BACKEND, else local]. 'process' has NO isolation.",
)
@click.option("--timeout", type=float, help="Wall-clock limit in seconds [default: 300].")
@click.option("--memory", help="Memory limit, e.g. 256M [default: 512M].")
@click.option("--pids", type=int, help="Most processes and threads at once [default: 256].")
@click.option("--cpus", type=float, help="CPU limit in cores, e.g. 0.5 [default: 1].")
@click.option(
    "--disk", help="Size of each of the workspace, /tmp and /dev/shm, e.g. 64M [default: 256M]."
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="K=V",
    help="Set a variable in the sandbox (repeatable). K alone copies it from here.",
)
@click.option(
    "--mount",
    "mount_items",
    multiple=True,
    metavar="HOST:SANDBOX[:rw]",
    help="Grant a host path, read-only unless :rw (repeatable).",
)
@click.option("--image", help="'host' or a directory root filesystem [default: host].")
@click.option("--cwd", help="Working directory in the sandbox [default: /home/user].")
@click.option("--id", "execution_id", help="Execution id [default: generated].")
@network_options
@click.option("--json", "as_json", is_flag=True, help="Print only the result, as JSON.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(
    backend: str | None,
    timeout: float | None,
    memory: str | None,
    pids: int | None,
    cpus: float | None,
    disk: str | None,
    env_items: tuple[str, ...],
    mount_items: tuple[str, ...],
    image: str | None,
    cwd: str | None,
    execution_id: str | None,
    allow_domains: tuple[str, ...],
    deny_domains: tuple[str, ...],
    network_file: IO[str] | None,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND once in a fresh sandbox, streaming its output.

    Exits with the command's exit status; 124 when it timed out (like timeout(1)); 125 when
    the sandbox itself failed; 130 when interrupted.

    \b
    Example:
      ringfence exec --timeout 10 --memory 128M -- python3 -c 'print(1)'
      ringfence exec --allow-domain pypi.org --allow-domain files.pythonhosted.org \\
          -- pip install --target /tmp/lib six

    The sandbox has no network unless --allow-domain or --network gives it a policy
    (then this process runs the egress proxy; 'process' has the host's network).
    """
    network = policy_from_options(allow_domains, deny_domains, network_file)
    try:
        request = ExecutionRequest(
            command=list(command),
            env=_parse_env(env_items),
            mounts=[Mount.parse(item) for item in mount_items],
            timeout=timeout,
            image=image,
            cwd=cwd,
            limits=ResourceLimits(memory=memory, pids=pids, cpus=cpus, disk=disk),
            network=network,
            **({"id": execution_id} if execution_id else {}),
        )
    except (ValidationError, ValueError) as exc:
        raise click.UsageError(validation_message(exc)) from None
    config = settings(backend=backend)
    try:
        executor = create_executor(config)
    except UnknownBackend as exc:
        raise click.UsageError(exc.message) from None
    except BackendUnavailable as exc:
        fail(exc.message, EXIT_RINGFENCE_FAILED)
    try:
        result = asyncio.run(_run(executor, request, stream=not as_json))
    except KeyboardInterrupt:
        fail("interrupted; the sandbox was killed", EXIT_INTERRUPTED)
    except RingfenceError as exc:
        fail(exc.message, 2 if exc.code == "invalid_request" else EXIT_RINGFENCE_FAILED)
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    elif result.error:
        click.echo(f"ringfence: {result.error}", err=True)
    sys.exit(exit_code_for(result))


async def _run(executor: Executor, request: ExecutionRequest, *, stream: bool) -> ExecutionResult:
    def write(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    try:
        return await executor.execute(request, on_output=write if stream else None)
    finally:
        await executor.aclose()


def exit_code_for(result: ExecutionResult) -> int:
    """The CLI's exit status for a result (see ``ringfence exec --help``)."""
    if result.status is Status.TIMED_OUT:
        return EXIT_TIMEOUT
    if result.status is Status.CANCELLED:
        return EXIT_INTERRUPTED
    if result.exit_code is None:
        return EXIT_RINGFENCE_FAILED
    return result.exit_code if 0 <= result.exit_code <= 255 else EXIT_RINGFENCE_FAILED


def _parse_env(items: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise ValueError(f"--env {name}: no '=' and no such variable here to copy")
            value = os.environ[name]
        env[name] = value
    return env

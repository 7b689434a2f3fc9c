"""The ``ringfence`` command line."""

from __future__ import annotations

import logging

import click

from ringfence import __version__
from ringfence.cli._common import OneLineErrors
from ringfence.cli.audit import audit
from ringfence.cli.browse import browse
from ringfence.cli.doctor import doctor
from ringfence.cli.exec_cmd import exec_command
from ringfence.cli.files import files
from ringfence.cli.k8s import k8s
from ringfence.cli.keys import keys
from ringfence.cli.mcp import mcp
from ringfence.cli.proposals import approve, proposals, propose, reject
from ringfence.cli.sandbox import sandbox
from ringfence.cli.sandbox_project import COMMANDS as SANDBOX_PROJECT_COMMANDS
from ringfence.cli.sandbox_shell import shell
from ringfence.cli.sandbox_state import COMMANDS as SANDBOX_STATE_COMMANDS
from ringfence.cli.sandbox_top import top
from ringfence.cli.serve import serve
from ringfence.cli.template import template
from ringfence.cli.volume import volume

__all__ = ["main"]


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ringfence")
def main() -> None:
    """Ringfence: run untrusted, agent-written code in isolated, bounded sandboxes."""
    logging.basicConfig(level=logging.WARNING, format="ringfence: %(message)s")


main.add_command(exec_command)
main.add_command(doctor)
main.add_command(serve)
main.add_command(keys)
for command in [*SANDBOX_STATE_COMMANDS, *SANDBOX_PROJECT_COMMANDS]:
    sandbox.add_command(command)
sandbox.add_command(shell)
sandbox.add_command(top)
main.add_command(sandbox)
main.add_command(files)
main.add_command(browse)
main.add_command(volume)
main.add_command(audit)
main.add_command(template)
main.add_command(propose)
main.add_command(proposals)
main.add_command(approve)
main.add_command(reject)
main.add_command(mcp)
main.add_command(k8s)

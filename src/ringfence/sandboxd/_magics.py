"""IPython's ``!shell`` lines and the common ``%`` magics, for the stdlib Python kernel.

A cell is rewritten line by line before it is parsed, as IPython's input transformers do:

- ``!cmd`` runs ``cmd`` in ``/bin/sh``, its output the cell's; ``x = !cmd`` captures its
  stdout as a list of lines;
- ``%cd DIR``, ``%pwd``, ``%env [NAME[=VALUE]]``, ``%pip ARGS`` (this interpreter's pip),
  ``%matplotlib ...`` (figures are always sent inline: a no-op);
- a cell opening with ``%%bash`` or ``%%sh`` runs the rest in that shell, ``%%writefile
  PATH`` writes it to ``PATH``;
- any other magic is IPython's ``UsageError``.

IPython's ``{expr}`` and ``$name`` expansion in shell lines is not done: the command runs as
written. A line is taken for a magic by how it starts, so a ``!`` or ``%`` opening a line
inside a multi-line string is rewritten too (IPython's line transformers have the same
limit).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

__all__ = ["UsageError", "rewrite", "runtime"]

_SHELL = re.compile(r"^(\s*)(?:([A-Za-z_][\w.]*)\s*=\s*)?!(.*)$")
_MAGIC = re.compile(r"^(\s*)%(\w+)\s*(.*)$")
_CELL_MAGIC = re.compile(r"^%%(\w+)\s*(.*)$")


class UsageError(Exception):
    """IPython's name for a magic used wrongly, or one that does not exist."""


def rewrite(code: str) -> str:
    """The cell with its shell lines and magics as calls of ``runtime``'s functions."""
    lines = code.splitlines(keepends=True)
    if lines and (cell := _CELL_MAGIC.match(lines[0].rstrip("\n"))):
        body = "".join(lines[1:])
        return f"__ringfence_cell_magic__({cell[1]!r}, {cell[2]!r}, {body!r})\n"
    out = []
    for line in lines:
        bare = line.rstrip("\r\n")
        end = line[len(bare) :]
        if shell := _SHELL.match(bare):
            indent, target, command = shell.groups()
            call = f"__ringfence_shell__({command.strip()!r}, capture={target is not None})"
            out.append(f"{indent}{target} = {call}{end}" if target else f"{indent}{call}{end}")
        elif magic := _MAGIC.match(bare):
            indent, name, args = magic.groups()
            out.append(f"{indent}__ringfence_magic__({name!r}, {args.strip()!r}){end}")
        else:
            out.append(line)
    return "".join(out)


def runtime() -> dict[str, Any]:
    """The names the rewritten cell calls, for the kernel's namespace."""
    return {
        "__ringfence_shell__": shell,
        "__ringfence_magic__": magic,
        "__ringfence_cell_magic__": cell_magic,
    }


def shell(command: str, *, capture: bool = False) -> list[str] | None:
    """Run ``command`` in /bin/sh; with ``capture``, its stdout as lines (IPython's SList)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if capture:
        done = subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.PIPE, check=False)
        return done.stdout.decode(errors="replace").splitlines()
    subprocess.run(["/bin/sh", "-c", command], check=False)  # its output is the cell's
    return None


def magic(name: str, args: str) -> Any:
    if name == "cd":
        os.chdir(os.path.expanduser(args or "~"))
        print(os.getcwd())
        return None
    if name == "pwd":
        return os.getcwd()
    if name == "env":
        return _env(args)
    if name == "pip":
        shell(f"{sys.executable} -m pip {args}")
        return None
    if name == "matplotlib":
        return None  # figures are sent inline whatever the backend
    raise UsageError(f"Line magic function `%{name}` not found.")


def cell_magic(name: str, args: str, body: str) -> None:
    if name in ("bash", "sh"):
        sys.stdout.flush()
        sys.stderr.flush()
        subprocess.run([f"/bin/{name}", "-c", body], check=False)
        return
    if name == "writefile":
        if not args:
            raise UsageError("%%writefile needs a file name")
        path = os.path.expanduser(args.split()[-1])
        existed = os.path.exists(path)
        with open(path, "a" if "-a" in args.split()[:-1] else "w") as file:
            file.write(body)
        print(f"{'Overwriting' if existed else 'Writing'} {args.split()[-1]}")
        return
    raise UsageError(f"Cell magic `%%{name}` not found.")


def _env(args: str) -> Any:
    if not args:
        return dict(os.environ)
    name, sep, value = args.partition("=")
    if not sep:
        name, _, value = args.partition(" ")
        if not value:
            if name not in os.environ:
                raise UsageError(f"Environment does not have key: {name}")
            return os.environ[name]
    os.environ[name.strip()] = value.strip()
    print(f"env: {name.strip()}={value.strip()}")
    return None

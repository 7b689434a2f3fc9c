"""Paths of a project that the host runs or trusts as configuration: a sync never writes
them unless the caller names them and opts in (docs/design.md 14.7).

A sandbox that may write ``.git/config`` (``core.fsmonitor``, ``core.pager``, aliases),
``.git/hooks/*`` or an ``.envrc`` gets its code run by the owner's next ``git status``,
commit or ``cd``: a copy-on-write view would become code execution on the host. So these
are *sensitive*, at any depth of the project (a nested checkout runs its own hooks), the
name compared case-folded (a case-insensitive file system, or a tool that folds, takes
``.GIT`` for ``.git``):

- ``.git`` and everything below it (config, hooks, info/attributes, modules, a ``.git``
  file pointing elsewhere), ``.gitmodules``, ``.gitattributes`` (filters and diff drivers);
- what runs when a directory is entered or opened: ``.envrc``, ``.vscode``, ``.idea``,
  ``.devcontainer``, ``.husky``, ``.pre-commit-config.yaml``, and agents' own
  configuration (``.claude``, ``.cursor``, ``.mcp.json``);
- shell start files (``.bashrc``, ``.profile``, ``.zshrc``, ...), for a project that is a
  home directory;
- package tools' and credentials' configuration, which can name commands or registries
  (``.npmrc``, ``.yarnrc``, ``.yarnrc.yml``, ``.pypirc``, ``pip.conf``, ``.netrc``,
  ``.ssh``, ``.gnupg``).

The diff flags them (``sensitive``); a sync refuses them unless ``include_sensitive`` is
set *and* one of the requested paths is itself sensitive and selects the change (so
``paths=["src"]`` never brings ``src/.envrc``, and ``paths=None`` never brings any).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SENSITIVE_NAMES", "is_sensitive"]

SENSITIVE_NAMES = frozenset(
    {
        ".git", ".gitmodules", ".gitattributes",
        ".envrc", ".vscode", ".idea", ".devcontainer", ".husky", ".pre-commit-config.yaml",
        ".claude", ".cursor", ".mcp.json",
        ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile",
        ".zshrc", ".zshenv", ".zprofile", ".zlogin", ".zlogout", ".inputrc",
        ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc", "pip.conf", ".netrc",
        ".ssh", ".gnupg",
    }
)  # fmt: skip


def is_sensitive(parts: Sequence[str]) -> bool:
    """Whether the project path ``parts`` is, or is below, a sensitive name."""
    return any(part.casefold() in SENSITIVE_NAMES for part in parts)

"""Tenants' volumes inside one sandbox: each shown through an idmapped view made in the
sandbox's own tmpfs volume (``volume.Volume``), which bwrap binds at the volume's target.

A volume's filesystem stores the ids sandboxes see (``disks``: 0 the sandbox root's, 1000
its user's). The view maps exactly those two to this sandbox's two host uids, so inside its
files belong to root and user as they should, a file the sandbox writes lands on disk as 0
or 1000, and no host uid of any sandbox is ever written to the volume: the next sandbox to
mount it (other uids) sees the same owners. A process of no mapped uid cannot create
anything through the view (the kernel refuses writes whose owner it cannot map).

Each view is ``nosuid`` and ``nodev`` (setuid bits and device nodes a volume holds are
inert, whoever wrote them), and read-only when the mount asks for it: then bwrap's
``--ro-bind`` is read-only over a read-only view, and root inside, which cannot mount,
cannot change either. The views live under ``<volume>/shared/`` (root's, 0711: the
sandbox's uid traverses it as bwrap binds) and go with the tmpfs when the sandbox ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ringfence.backends.local import _mounts

__all__ = ["SharedBind", "bind_shared"]

SHARED = "shared"


@dataclass(frozen=True)
class SharedBind:
    """A tenant's volume as bwrap binds it: ``view`` (host) at ``target`` (sandbox)."""

    view: str
    target: str
    read_only: bool


def bind_shared(
    volume_path: Path, mounts: Iterable[tuple[Path, str, bool]], userns: int
) -> tuple[SharedBind, ...]:
    """Make an idmapped view (through ``userns``: 0 and 1000 to the sandbox's host uids)
    of each ``(source, target, read_only)`` under ``volume_path``. Raises ``OSError``
    (views made already go when the caller closes the volume)."""
    binds = []
    parent = volume_path / SHARED
    for index, (source, target, read_only) in enumerate(mounts):
        if index == 0:
            parent.mkdir(mode=0o711)
            parent.chmod(0o711)
        view = parent / str(index)
        view.mkdir(mode=0o700)
        _mounts.idmapped_view(str(source), str(view), userns, writable=not read_only)
        binds.append(SharedBind(str(view), target, read_only))
    return tuple(binds)

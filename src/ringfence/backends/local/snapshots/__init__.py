"""Snapshots of a sandbox's files: the engine under checkpoint, rollback, export and fork.

A sandbox's volume (a tmpfs the server mounts for it) holds its live layers: the workspace,
``/tmp`` and the upper directories of the overlays over the template's root. A
``SnapshotStore`` keeps that sandbox's checkpoints on the same volume, in a directory only
root can enter and that no sandbox ever sees:

- ``take()`` (the sandbox frozen) walks every layer with directory fds and ``O_NOFOLLOW``
  (a symlink is copied as a link, never followed; a mount is never crossed) and copies
  what changed since the previous snapshot, hard-linking the rest from it. Kept: regular
  files, directories, symlinks and overlay whiteouts with their mode, numeric owner, times
  and ``user.*`` / ``trusted.overlay.*`` xattrs. Refused (nothing captured): a device node,
  or an entry owned by an id that is not the sandbox's. Skipped, listed by ``skipped()``:
  fifos and sockets. Snapshot files are never written again and no live file is ever a
  link to one (restores copy), so a snapshot cannot be changed through the live tree.
- ``restore(id, overlay_view=...)`` (frozen) makes every layer byte-identical to the
  checkpoint in place; running processes survive. For mounted overlays see ``_restore``.
  It checks all it can first (the views, the volume's room, mounts in the way) and refuses
  with nothing changed; a failure once it has written is ``RestoreIncomplete``: the
  sandbox must then be killed, never thawed.
- Files the sandbox's processes map shared and writable (``SnapshotStore(pids=...)``) are
  treated as changed by both: writes through such a mapping move no ctime (``_mapped``).
- ``export(id, target)`` persists a checkpoint off the volume, sealed (HMAC) with the
  server's key and bound to the caller's ``context``; ``populate(source, layers, owners,
  key, context)`` checks an export whole, then fills a fresh volume's layers with copies
  (a fork's children, a resumed sandbox), with one directory fd however large the tree.

Budgets: a count, a byte total and an entry total per sandbox (``SnapshotBudgetExceeded``
names the one passed); a checkpoint's ``bytes`` are what it copied, shared files count once
in the total; its entries are every name it made (each costs the server kernel memory).
"""

from ringfence.backends.local.snapshots._export import populate
from ringfence.backends.local.snapshots._restore import RestoreIncomplete
from ringfence.backends.local.snapshots._store import Budget, OverlayView, SnapshotStore

__all__ = ["Budget", "OverlayView", "RestoreIncomplete", "SnapshotStore", "populate"]

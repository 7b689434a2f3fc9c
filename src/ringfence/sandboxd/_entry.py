"""``EntryInfo`` of a path, as E2B's envd reports it.

For a symlink: ``type`` and ``mode`` are the target's (a dangling link is
``FILE_TYPE_SYMLINK``, where envd would say UNSPECIFIED and the SDK would drop it),
``isSymlink`` is true and ``symlinkTarget`` is the fully resolved path; ``size``,
``permissions`` and ``modifiedTime`` are the link's own. Owner and group are names when
/etc/passwd and /etc/group know them, else the numbers. ``metadata``: the file's
``user.e2b.*`` extended attributes (``_xattrs``), when it has any.
"""

from __future__ import annotations

import os
import stat
import time

from ._xattrs import read_metadata

__all__ = ["DIRECTORY", "FILE", "SYMLINK", "entry_info", "file_type", "rfc3339"]

FILE, DIRECTORY, SYMLINK, UNSPECIFIED = (
    "FILE_TYPE_FILE",
    "FILE_TYPE_DIRECTORY",
    "FILE_TYPE_SYMLINK",
    "FILE_TYPE_UNSPECIFIED",
)

_names: dict[tuple[str, int], str] = {}


def _name(kind: str, ident: int) -> str:
    key = (kind, ident)
    if key not in _names:
        try:
            if kind == "user":
                import pwd

                _names[key] = pwd.getpwuid(ident).pw_name
            else:
                import grp

                _names[key] = grp.getgrgid(ident).gr_name
        except (KeyError, ImportError):
            _names[key] = str(ident)
        if len(_names) > 256:
            _names.clear()
    return _names[key]


def file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISLNK(mode):
        return SYMLINK
    return UNSPECIFIED


def rfc3339(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if nanos:
        base += ("." + f"{nanos:09d}").rstrip("0")
    return base + "Z"


def entry_info(path: str, st: os.stat_result | None = None) -> dict[str, object]:
    """Raise OSError if ``path`` cannot be lstat'ed."""
    if st is None:
        st = os.lstat(path)
    mode = st.st_mode
    info: dict[str, object] = {
        "name": os.path.basename(path) or "/",
        "type": file_type(mode),
        "path": path,
        "size": str(st.st_size),
        "mode": stat.S_IMODE(mode),
        "permissions": stat.filemode(mode),
        "owner": _name("user", st.st_uid),
        "group": _name("group", st.st_gid),
        "modifiedTime": rfc3339(st.st_mtime_ns),
    }
    if stat.S_ISLNK(mode):
        info["isSymlink"] = True
        info["symlinkTarget"] = os.path.realpath(path)
        try:
            target = os.stat(path)
        except OSError:
            pass  # dangling: stays FILE_TYPE_SYMLINK
        else:
            info["type"] = file_type(target.st_mode)
            info["mode"] = stat.S_IMODE(target.st_mode)
    if metadata := read_metadata(path):
        info["metadata"] = metadata
    return info

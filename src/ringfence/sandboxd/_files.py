"""The ``filesystem.Filesystem`` service, except watches (``_watch``).

Relative paths start at the home directory. Errors: a missing path is ``not_found`` (except
for ``Remove``, which is done when nothing is there, as envd's is), an
existing one ``already_exists``, a file where a directory is needed (or the reverse)
``invalid_argument``, a permission problem ``permission_denied``, a full disk
``resource_exhausted``.
"""

from __future__ import annotations

import os
import stat

from ._codec import msg_int, msg_str
from ._entry import entry_info
from ._errors import RpcError, from_os_error, invalid
from ._paths import resolve

__all__ = ["list_dir", "make_dir", "move", "remove", "stat_entry"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._codec import Msg
    from ._rpc import Call

MAX_ENTRIES = 50_000


def _entry(path: str) -> Msg:
    try:
        return entry_info(path)
    except OSError as exc:
        raise from_os_error(exc, f"stat {path}") from None


def stat_entry(call: Call) -> Msg:
    return {"entry": _entry(resolve(msg_str(call.message, "path")))}


def list_dir(call: Call) -> Msg:
    """Entries under a directory, ``depth`` levels deep (1: the direct children), in envd's
    order (Go's ``filepath.WalkDir``): depth first, each directory's entries by name, a
    directory's contents right after it.

    Symlinks to directories are listed but not descended into; a subdirectory that cannot be
    read is listed without its contents; a listing longer than MAX_ENTRIES is refused
    (``resource_exhausted``) rather than built in memory.
    """
    path = resolve(msg_str(call.message, "path"))
    depth = msg_int(call.message, "depth", maximum=2**32 - 1) or 1
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            raise invalid(f"{path} is not a directory")
        top = _children(path)
    except OSError as exc:
        raise from_os_error(exc, f"list {path}") from None
    entries: list[Msg] = []
    stack = [(iter(top), 1)]
    while stack:
        children, level = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            continue
        try:
            entries.append(entry_info(child.path, child.stat(follow_symlinks=False)))
        except OSError:
            continue  # removed while listing
        if len(entries) > MAX_ENTRIES:
            raise RpcError(
                "resource_exhausted",
                f"{path} has more than {MAX_ENTRIES} entries at depth {depth}; "
                "list it with a smaller depth",
            )
        if level < depth and child.is_dir(follow_symlinks=False):
            try:
                stack.append((iter(_children(child.path)), level + 1))
            except OSError:
                continue  # a subdirectory we may not read: list what we can
    return {"entries": entries}


def _children(directory: str) -> list[os.DirEntry[str]]:
    with os.scandir(directory) as it:
        return sorted(it, key=lambda e: e.name)


def make_dir(call: Call) -> Msg:
    path = resolve(msg_str(call.message, "path"))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise from_os_error(exc, f"mkdir {path}") from None
    else:
        if stat.S_ISDIR(st.st_mode):
            raise RpcError("already_exists", f"directory {path} already exists")
        raise invalid(f"{path} already exists and is not a directory")
    try:
        os.makedirs(path)
    except OSError as exc:
        raise from_os_error(exc, f"mkdir {path}") from None
    return {"entry": _entry(path)}


def move(call: Call) -> Msg:
    source = resolve(msg_str(call.message, "source"), "source")
    destination = resolve(msg_str(call.message, "destination"), "destination")
    try:
        os.lstat(source)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        os.rename(source, destination)
    except OSError as exc:
        raise from_os_error(exc, f"move {source} to {destination}") from None
    return {"entry": _entry(destination)}


def remove(call: Call) -> Msg:
    path = resolve(msg_str(call.message, "path"))
    if path == "/":
        raise invalid("refusing to remove /")
    try:
        remove_tree(path)
    except FileNotFoundError:
        pass  # as envd's os.RemoveAll: nothing there is nothing to remove (cleanup code)
    except OSError as exc:
        raise from_os_error(exc, f"remove {path}") from None
    return {}


def remove_tree(path: str) -> None:
    """Remove a file, a symlink (not its target) or a directory with everything in it.

    Raises:
        FileNotFoundError: nothing is at ``path``. Whatever vanishes beneath it meanwhile
            is not an error: it is removed.
    """
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        os.unlink(path)
        return
    stack = [path]
    while stack:
        directory = stack[-1]
        subdirs = []
        try:
            with os.scandir(directory) as it:
                for child in it:
                    if child.is_dir(follow_symlinks=False):
                        subdirs.append(child.path)
                    else:
                        try:  # noqa: SIM105 - contextlib costs memory
                            os.unlink(child.path)
                        except FileNotFoundError:
                            pass  # removed meanwhile
        except FileNotFoundError:
            if directory == path:
                raise
            stack.pop()  # removed meanwhile
            continue
        if subdirs:
            stack.extend(subdirs)
        else:
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                if directory == path:
                    raise
            stack.pop()

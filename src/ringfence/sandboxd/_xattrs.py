"""File metadata as envd keeps it: ``user.e2b.<key>`` extended attributes.

An upload's ``X-Metadata-<key>: <value>`` headers (keys lowercased) replace the file's whole
set, an upload without any clearing it, as envd's does; ``EntryInfo.metadata`` reads it
back. A filesystem without user xattrs (``/proc``, some network ones) keeps none, silently,
as envd's does: what is read back then says so.
"""

from __future__ import annotations

import errno
import os
import re

from ._errors import invalid

__all__ = ["metadata_of", "read_metadata", "write_metadata"]

HEADER_PREFIX = "x-metadata-"
_NAMESPACE = "user.e2b."
# keys travel as header names (RFC 7230 tokens), values as printable US-ASCII
_KEY = re.compile(r"[a-z0-9!#$%&'*+\-.^_`|~]+")
_VALUE = re.compile(r"[\x20-\x7e]*")
MAX_KEYS = 64
_MAX_BYTES = 16 * 1024  # of keys and values together
_UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def metadata_of(headers: dict[str, str]) -> dict[str, str]:
    """The metadata an upload's (lowercased) headers carry.

    Raises:
        RpcError: ``invalid_argument``, a key or value E2B's SDK would not send, or too much.
    """
    found = {
        name[len(HEADER_PREFIX) :]: value
        for name, value in headers.items()
        if name.startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX)
    }
    for key, value in found.items():
        if not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            raise invalid(f"invalid metadata: {key!r} is not a header token with a printable value")
    if len(found) > MAX_KEYS or sum(len(k) + len(v) for k, v in found.items()) > _MAX_BYTES:
        raise invalid(f"invalid metadata: at most {MAX_KEYS} keys and {_MAX_BYTES} bytes")
    return found


def write_metadata(path: str, metadata: dict[str, str]) -> None:
    """Make ``metadata`` the file's whole set.

    Raises:
        OSError: other than the filesystem having no user xattrs (a full one: ENOSPC).
    """
    try:
        for name in os.listxattr(path):
            if name.startswith(_NAMESPACE) and name[len(_NAMESPACE) :] not in metadata:
                os.removexattr(path, name)
        for key, value in metadata.items():
            os.setxattr(path, _NAMESPACE + key, value.encode())
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise


def read_metadata(path: str) -> dict[str, str]:
    """The file's metadata (none where it cannot be read: a symlink, no xattrs)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(_NAMESPACE):
            try:
                value = os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            found[name[len(_NAMESPACE) :]] = value.decode("ascii", "replace")
    return found

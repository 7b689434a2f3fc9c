"""The daemon's methods and its users: written once, read by the daemon and the host.

The daemon routes its Connect RPC calls by ``METHODS``; the host reads the same table to
tell the calls that change a sandbox (audited) from those that only look. This is the one
public module of ``sandboxd``: the host may import it, it imports nothing (the daemon loads
it while idle, and never imports host code).
"""

from __future__ import annotations

__all__ = [
    "CLIENT_STREAM",
    "CLIENT_STREAMS",
    "FILESYSTEM",
    "GROUP_PORT",
    "METHODS",
    "PROCESS",
    "ROOT_USER",
    "SANDBOX_USER",
    "SERVER_STREAM",
    "UNARY",
    "USERS",
    "changes",
    "kind_of",
    "user_refusal",
]

# Where a sandbox in a group reaches its peers' ports: an HTTP proxy (CONNECT, or absolute
# URLs) on its own loopback, served by the daemon and decided by the host (sandboxd/_tunnel).
GROUP_PORT = 49982

# The services (E2B envd's).
PROCESS = "process.Process"
FILESYSTEM = "filesystem.Filesystem"

# How a call's messages travel: one each way, a stream of answers, a stream of requests.
UNARY, SERVER_STREAM, CLIENT_STREAM = "unary", "server_stream", "client_stream"
_CHANGES, _LOOKS = True, False

# "package.Service/Method" → (kind, whether it changes the sandbox, module, function that
# serves it in the daemon). Modules load on their first call.
METHODS = {
    PROCESS + "/Start": (SERVER_STREAM, _CHANGES, "_process_rpc", "start"),
    PROCESS + "/Connect": (SERVER_STREAM, _LOOKS, "_process_rpc", "connect"),
    PROCESS + "/List": (UNARY, _LOOKS, "_process_rpc", "list_processes"),
    PROCESS + "/SendInput": (UNARY, _CHANGES, "_process_rpc", "send_input"),
    PROCESS + "/CloseStdin": (UNARY, _CHANGES, "_process_rpc", "close_stdin"),
    PROCESS + "/SendSignal": (UNARY, _CHANGES, "_process_rpc", "send_signal"),
    PROCESS + "/StreamInput": (CLIENT_STREAM, _CHANGES, "_process_rpc", "stream_input"),
    PROCESS + "/Update": (UNARY, _CHANGES, "_process_rpc", "update"),
    FILESYSTEM + "/Stat": (UNARY, _LOOKS, "_files", "stat_entry"),
    FILESYSTEM + "/ListDir": (UNARY, _LOOKS, "_files", "list_dir"),
    FILESYSTEM + "/MakeDir": (UNARY, _CHANGES, "_files", "make_dir"),
    FILESYSTEM + "/Move": (UNARY, _CHANGES, "_files", "move"),
    FILESYSTEM + "/Remove": (UNARY, _CHANGES, "_files", "remove"),
    FILESYSTEM + "/WatchDir": (SERVER_STREAM, _LOOKS, "_watch", "watch_dir"),
    FILESYSTEM + "/CreateWatcher": (UNARY, _LOOKS, "_watch", "create_watcher"),
    FILESYSTEM + "/GetWatcherEvents": (UNARY, _LOOKS, "_watch", "get_watcher_events"),
    FILESYSTEM + "/RemoveWatcher": (UNARY, _LOOKS, "_watch", "remove_watcher"),
}
# The calls whose requests stream (their bodies are bounded by the sandbox, not the host).
CLIENT_STREAMS = tuple(name for name, method in METHODS.items() if method[0] == CLIENT_STREAM)

# What a sandbox runs as unless asked otherwise: its unprivileged user (the daemon's
# ``--user``); and root inside its own user namespace, when its daemon runs as that
# (``--root``; see ``_users``).
SANDBOX_USER = "user"
ROOT_USER = "root"
USERS = (SANDBOX_USER, ROOT_USER)


def changes(name: str) -> bool:
    """Whether the call ``name`` ("package.Service/Method") changes the sandbox; a method
    the daemon does not have changes nothing (the daemon refuses it)."""
    method = METHODS.get(name)
    return method is not None and method[1]


def kind_of(name: str) -> str | None:
    """``UNARY``, ``SERVER_STREAM`` or ``CLIENT_STREAM``; None for a method it does not have."""
    method = METHODS.get(name)
    return None if method is None else method[0]


def user_refusal(
    user: str | None, users: tuple[str, ...] = USERS, *, inside: bool = False
) -> str | None:
    """Why a call as ``user`` is refused, or None when it names no user or one of
    ``users``: asking for another is refused, never run as someone else.

    The daemon refuses from ``inside`` ("this sandbox ..."), the host of "a sandbox ...":
    each door keeps the words it has always answered. The host allows both ``USERS``; a
    daemon that cannot run as root (its host runs Ringfence unprivileged) refuses it."""
    if user is None or user in users:
        return None
    which = "this sandbox" if inside else "a sandbox"
    if len(users) == 1:
        return (
            f"user {user!r} is not available: {which} runs everything as its one "
            f"unprivileged user {users[0]!r}"
        )
    named = " and ".join(repr(one) for one in users)
    return f"user {user!r} is not available: {which} has the users {named} only"

"""Who a request acts as: the sandbox user, or root inside when the daemon runs as root.

Started with ``--root`` (the host maps ns 0 and ns 1000 to two host uids of the sandbox's
own and starts the daemon as ns 0 with Docker's capabilities), the daemon serves two users:
``user`` (uid and gid 1000, no capabilities: the default) and ``root`` (uid 0, the daemon's
own capabilities). Without it the daemon runs as whatever uid it was started as and serves
its one user, as before; asking for ``root`` is refused.

As root, each connection thread acts as the user its current request names, for files:
its filesystem uid and gid (``setfsuid``/``setfsgid``, which the kernel keeps per thread)
decide who owns what it creates and what it may open, and a non-zero filesystem uid drops
the thread's file capabilities (``CAP_DAC_OVERRIDE``, ``CAP_FOWNER``, ...) until it goes
back to 0. A command is started as its user in the forked child (``become``): all of its
uids and gids 1000, no supplementary groups, and with that every capability gone (the
kernel clears them when no uid is 0 any more). The daemon is another uid than the user's
commands, so they cannot signal, trace or open it; root's commands are its uid, and the
daemon is not dumpable, so without ``CAP_SYS_PTRACE`` (not in Docker's set) they cannot
trace it or take its descriptors either.
"""

from __future__ import annotations

import _thread
import os

from .methods import ROOT_USER, SANDBOX_USER

__all__ = [
    "USER_ID",
    "act_as",
    "available",
    "become",
    "current",
    "enable_root",
    "env_for",
    "switches",
]

USER_ID = 1000  # the sandbox user's uid and gid
_ROOT_HOME = "/root"
_state = {"root": False}
_local = _thread._local()
_calls: dict[str, object] = {}


def enable_root() -> str | None:
    """Serve ``root`` too (``--root``); why not, or None. Only as uid 0 and where the
    per-thread filesystem ids can be set (fail closed: never serve root with file access
    that could not act as the user)."""
    if os.geteuid() != 0:
        return f"--root needs the daemon to run as uid 0, not {os.geteuid()}"
    try:
        import _ctypes
    except ImportError:
        return "--root needs _ctypes (setfsuid)"
    libc = _ctypes.dlopen(None, 2)  # type: ignore[arg-type]
    call = getattr(_ctypes, "call_function", None)
    if call is None:
        return "--root needs _ctypes.call_function"
    _calls["call"] = call
    _calls["setfsuid"] = _ctypes.dlsym(libc, "setfsuid")
    _calls["setfsgid"] = _ctypes.dlsym(libc, "setfsgid")
    why = _clear_inheritable(call, _ctypes.dlsym(libc, "capset"))
    if why is not None:
        return why
    _state["root"] = True
    return None


def _clear_inheritable(call: object, capset: int) -> str | None:
    """Empty the inheritable set (and with it the ambient one bwrap filled): a command
    keeps no capability across its exec but by root's own rule, which needs uid 0, so
    the user's commands start with every set empty. no_new_privs already stops file
    capabilities from adding any; this leaves nothing for them to add to."""
    import _struct

    status = {}
    with open("/proc/self/status") as lines:
        for line in lines:
            name, _, value = line.partition(":")
            status[name] = value.strip()
    effective, permitted = int(status["CapEff"], 16), int(status["CapPrm"], 16)
    header = _struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = _struct.pack(
        "IIIIII", effective & 0xFFFFFFFF, permitted & 0xFFFFFFFF, 0,
        effective >> 32, permitted >> 32, 0,
    )  # fmt: skip
    if call(capset, (header, data)) != 0:  # type: ignore[operator]
        return "cannot clear the inheritable capabilities (capset)"
    return None


def available() -> tuple[str, ...]:
    return (SANDBOX_USER, ROOT_USER) if _state["root"] else (SANDBOX_USER,)


def switches(user: str) -> bool:
    """Whether a command for ``user`` must change uid in its child (not the daemon's)."""
    return _state["root"] and user != ROOT_USER


def act_as(user: str) -> None:
    """This thread acts as ``user`` for files from now on (a no-op without ``--root``).

    Raises:
        OSError: the kernel did not take the ids (the request must fail, never run as root).
    """
    _local.user = user
    if not _state["root"]:
        return
    wanted = 0 if user == ROOT_USER else USER_ID
    call = _calls["call"]
    call(_calls["setfsgid"], (wanted,))  # type: ignore[operator]
    call(_calls["setfsuid"], (wanted,))  # type: ignore[operator]
    # Each returns the id in force before the call: asking for an invalid one changes
    # nothing and tells which holds.
    if call(_calls["setfsuid"], (-1,)) != wanted or call(_calls["setfsgid"], (-1,)) != wanted:  # type: ignore[operator]
        raise OSError(1, f"cannot act as {user!r}")


def current() -> str:
    """The user this thread acts as (the sandbox user until a request names one)."""
    user: str = getattr(_local, "user", SANDBOX_USER)
    return user


def become(user: str) -> None:
    """In a forked child, before exec: run as ``user`` for good (a no-op unless
    ``switches(user)``). Raises OSError when the kernel refuses (the exec must not run)."""
    if not switches(user):
        return
    os.setgroups([])
    os.setresgid(USER_ID, USER_ID, USER_ID)
    os.setresuid(USER_ID, USER_ID, USER_ID)


def env_for(user: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the login variables of ``user`` (root's HOME is /root when it exists)."""
    if user != ROOT_USER or not _state["root"]:
        return env
    env = dict(env, USER=ROOT_USER, LOGNAME=ROOT_USER)
    if os.path.isdir(_ROOT_HOME):
        env["HOME"] = _ROOT_HOME
    return env

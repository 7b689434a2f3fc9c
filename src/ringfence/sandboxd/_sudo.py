"""``sudo`` inside the sandbox: any process of the sandbox may run a command as root inside
(E2B's convention: its user has passwordless sudo), never as anyone on the host.

The template's ``/usr/bin/sudo`` cannot work here (every mount is nosuid, and its owner is
not mapped in the sandbox's user namespace), so the host shows ``bin/sudo`` of this package
in its place: a small client that hands this daemon its argv, working directory,
environment and its own stdin, stdout and stderr (``SCM_RIGHTS``) over an abstract unix
socket. Abstract sockets belong to a network namespace, and each sandbox has its own, so
only the sandbox's own processes reach it (another sandbox, and the host, cannot). The
daemon starts the command as the user asked for (root by default) on those descriptors, in
a session of its own, relays the signals the client forwards (^C, a kill of sudo) to the
command's process group, and answers its exit status.

Root inside is what ``user="root"`` gives through the API: ns uid 0, mapped to the sandbox's
own unprivileged host uid, with Docker's capability set inside the sandbox's user namespace
and the seccomp filter unchanged (docs/design.md 12.1). Without root inside (the daemon was
started without ``--root``) nothing listens, and the client says so.
"""

from __future__ import annotations

import _thread
import os
import signal as _signal

from ._codec import dumps, loads
from ._errors import RpcError
from ._sync import start_thread
from ._users import available, become, env_for
from .methods import ROOT_USER

__all__ = ["ADDRESS", "serve"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _socket import socket

ADDRESS = "\0ringfence-sudo"  # abstract: in the sandbox's network namespace only
_MAX_REQUEST = 256 << 10  # argv and environment together
_MAX_ARGS = 4096
# What the client relays: HUP INT QUIT USR1 USR2 TERM CONT WINCH (KILL and STOP cannot be).
_FORWARDED = frozenset({1, 2, 3, 10, 12, 15, 18, 28})
_SCM_RIGHTS = 1
_MSG_CMSG_CLOEXEC = 0x40000000
_MAX_CONNECTIONS = 64  # sudo calls waiting or running at once
_REQUEST_SECONDS = 10.0  # for a request to arrive whole
_open = [0]  # connections being served
_open_lock = _thread.allocate_lock()
_FDS = 3  # the client's stdin, stdout and stderr


def serve() -> None:
    """Listen on ``ADDRESS`` in a thread (a no-op unless the daemon serves root)."""
    if ROOT_USER not in available():
        return
    from _socket import AF_UNIX, SOCK_STREAM
    from _socket import socket as Socket

    listener = Socket(AF_UNIX, SOCK_STREAM)
    try:
        listener.bind(ADDRESS)
        listener.listen(16)
    except OSError:
        listener.close()
        return
    start_thread(lambda: _accept(listener))


def _accept(listener: socket) -> None:
    """Serve each connection in a thread, at most ``_MAX_CONNECTIONS`` at once: past it a
    connection is closed unanswered (a sandbox holding idle ones harms only its own sudo)."""
    import time
    from _socket import socket as Socket

    while True:
        try:
            fd, _ = listener._accept()  # type: ignore[attr-defined]
        except OSError:  # out of descriptors (EMFILE): wait, never spin
            time.sleep(0.1)
            continue
        conn = Socket(fileno=fd)
        with _open_lock:
            full = _open[0] >= _MAX_CONNECTIONS
            if not full:
                _open[0] += 1
        if full:
            conn.close()
            continue
        start_thread(lambda conn=conn: _serve(conn))  # type: ignore[misc]


def _serve(conn: socket) -> None:
    fds: list[int] = []
    try:
        conn.settimeout(_REQUEST_SECONDS)  # the request must come whole, and soon
        request = _receive(conn, fds)
        conn.settimeout(None)
        pid = _start(request, fds)
    except (OSError, ValueError, RpcError) as exc:
        _refuse(conn, _why(exc) if isinstance(exc, OSError) else str(exc))
        _release()
        return
    finally:
        for fd in fds:
            os.close(fd)
    try:
        _answer(conn, _wait(conn, pid))
    except OSError:
        pass
    finally:
        conn.close()
        _release()


def _release() -> None:
    with _open_lock:
        _open[0] -= 1


def _receive(conn: socket, fds: list[int]) -> dict[str, object]:
    """The request; the descriptors sent with it are added to ``fds`` (the caller closes
    them whatever happens). Raises ValueError when either is malformed."""
    import _struct

    # One byte carries the descriptors; the request follows it, up to its newline.
    # MSG_CMSG_CLOEXEC: a command another thread forks meanwhile must not inherit them.
    marker, ancillary, _, _ = conn.recvmsg(1, 64, _MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == 1 and kind == _SCM_RIGHTS:  # SOL_SOCKET
            count = len(payload) // 4
            fds.extend(_struct.unpack(f"{count}i", payload[: count * 4]))
    data = b""
    while not data.endswith(b"\n"):
        if len(data) >= _MAX_REQUEST:
            raise ValueError("the request is too large")
        chunk = conn.recv(_MAX_REQUEST - len(data))
        if not chunk:
            raise ValueError("the request ended early")
        data += chunk
    if marker != b"R" or len(fds) != _FDS:
        raise ValueError(f"expected {_FDS} descriptors (stdin, stdout, stderr), got {len(fds)}")
    return _checked(loads(data))


def _checked(request: object) -> dict[str, object]:
    if not isinstance(request, dict):
        raise ValueError("the request must be an object")
    argv, env, cwd, user = (request.get(k) for k in ("argv", "env", "cwd", "user"))
    if (
        not isinstance(argv, list)
        or not 0 < len(argv) <= _MAX_ARGS
        or not all(isinstance(a, str) and "\0" not in a for a in argv)
    ):
        raise ValueError("argv must be 1 to 4096 strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
    ):
        raise ValueError("env must map names to strings")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise ValueError("cwd must be an absolute path")
    if user not in available():
        raise ValueError(f"unknown user {user!r}: this sandbox has {', '.join(available())}")
    return request


def _start(request: dict[str, object], fds: list[int]) -> int:
    """Start the command (as ``_process._start`` does: a new session, the client's
    descriptors as 0, 1 and 2) and return its pid. Raises OSError when it cannot run."""
    argv = list(request["argv"])  # type: ignore[call-overload]
    user = str(request["user"])
    env = env_for(user, dict(request["env"]))  # type: ignore[call-overload]
    env["SUDO_COMMAND"] = " ".join(argv)[:4096]
    from ._process import which

    program = which(argv[0], env)  # RpcError when not found
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only os calls until exec
        try:
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            become(user)
            for directory in (str(request["cwd"]), env.get("HOME", "/"), "/"):
                try:
                    os.chdir(directory)
                    break
                except OSError:
                    pass
            _signal.signal(13, _signal.SIG_DFL)  # SIGPIPE: Python ignores it, programs expect it
            _signal.signal(25, _signal.SIG_DFL)  # SIGXFSZ
            os.execve(program, argv, env)
        except OSError as exc:
            os.write(gate_w, b"%d" % (exc.errno or 0))
        finally:
            os._exit(127)
    os.close(gate_w)
    failure = b""
    while chunk := os.read(gate_r, 64):  # exec closes the gate (CLOEXEC)
        failure += chunk
    os.close(gate_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(int(failure) if failure.isdigit() else 0, f"{argv[0]}: cannot run")
    return pid


def _wait(conn: socket, pid: int) -> dict[str, object]:
    """Relay the client's signals to the command's group until it ends; its status.

    The client closing its end (sudo itself killed) leaves the command running, as sudo's
    does: it is the caller's to stop."""
    import select

    pidfd = os.pidfd_open(pid)
    poller = select.poll()  # any descriptor number (select() stops at 1024)
    poller.register(pidfd, select.POLLIN)
    poller.register(conn.fileno(), select.POLLIN)
    try:
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if pidfd in ready:
                break
            message = conn.recv(64)
            if not message:
                poller.unregister(conn.fileno())
                continue
            for line in message.split(b"\n"):
                if line.isdigit() and int(line) in _FORWARDED:
                    try:  # noqa: SIM105 - contextlib costs memory
                        os.killpg(pid, int(line))
                    except OSError:
                        pass
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.waitstatus_to_exitcode(status)}


def _refuse(conn: socket, why: str) -> None:
    """Answer ``why`` and close; what the client still sends is read first (a little, for
    a second at most), so that the close does not reset the connection before the client
    has read the answer."""
    try:
        _answer(conn, {"error": why})
        conn.shutdown(1)  # SHUT_WR
        conn.settimeout(1.0)
        drained = 0
        while drained < _MAX_REQUEST and (chunk := conn.recv(65536)):
            drained += len(chunk)
    except OSError:
        pass
    finally:
        conn.close()


def _answer(conn: socket, answer: dict[str, object]) -> None:
    conn.sendall(dumps(answer).encode() + b"\n")


def _why(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return f"the request did not arrive within {_REQUEST_SECONDS:g} s"
    return f"{exc.filename or ''}{': ' if exc.filename else ''}{os.strerror(exc.errno or 0)}"

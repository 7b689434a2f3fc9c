"""Processes the daemon started: spawning, output fan-out, deadlines and reaping.

Each process runs in a new session (its own process group), with stdout and stderr on pipes
and stdin on a pipe or ``/dev/null``. One pump thread per process reads both pipes and a
pidfd, publishes output to every subscriber queue, kills the group at its deadline and reaps
the process. Subscribers (the ``Start`` stream and any ``Connect`` streams) each have a
bounded queue; a full queue blocks the pump, so a slow reader slows the process down rather
than growing memory. The process leaves the table once its end event is queued.

Signals go to the whole process group, so grandchildren die with their parent; a grandchild
that starts its own session (a daemon) escapes the group and dies only with the sandbox.

A terminal (``spawn(..., terminal=(rows, cols))``, see ``_pty``) is a process like the others
with one difference in its plumbing: its stdin, stdout and stderr are one pty, its output is
published as ``pty`` data, its input is written to the pty's master (``write_stdin``), and a
signal reaches its whole session (an interactive shell's jobs are process groups of their
own).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal itself imports enum
import _thread
import os
import time

from ._codec import b64encode, dumps
from ._connect import envelope
from ._errors import RpcError, invalid
from ._sync import Queue, start_thread
from ._users import become, switches
from .methods import SANDBOX_USER

# The daemon never changes directory: commands that run here can be posix_spawned.
_CWD = os.getcwd()

__all__ = ["Proc", "find", "listing", "spawn"]

_READ = 32 * 1024
QUEUE_LIMIT = 512 * 1024
TERMINAL_WAIT = 10.0  # seconds a write waits for a terminal that reads nothing
_POLLIN, _POLLOUT = 0x1, 0x4
_SIGKILL = 9
_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
}

_table_lock = _thread.allocate_lock()
_table: dict[int, Proc] = {}
_terminals = [0]  # terminals running (or starting): bounded by _pty.LIMIT


class Proc:
    def __init__(self, pid: int, config: dict[str, object], tag: str | None) -> None:
        self.pid = pid
        self.config = config
        self.tag = tag
        self.stdin: int | None = None  # a pipe, or a terminal's master (then terminal)
        self.terminal = False
        self.stdin_lock = _thread.allocate_lock()
        self.lock = _thread.allocate_lock()  # guards subscribers and exited
        self.subscribers: list[Queue] = []
        self.exited = False
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.timed_out = False
        self.end_frame: bytes | None = None  # the end event's envelope, once published

    def subscribe(self) -> Queue | None:
        """A queue of envelopes from now on, or None if the process has already ended."""
        queue = Queue(QUEUE_LIMIT)
        with self.lock:
            if self.exited:
                return None
            self.subscribers.append(queue)
        return queue

    def unsubscribe(self, queue: Queue) -> None:
        queue.close(discard=True)
        with self.lock:
            if queue in self.subscribers:
                self.subscribers.remove(queue)

    def signal(self, signum: int) -> None:
        with self.lock:
            if self.exited:
                raise RpcError("not_found", f"process {self.pid} has already exited")
            try:
                os.killpg(self.pid, signum)
            except ProcessLookupError:
                raise RpcError("not_found", f"process {self.pid} has already exited") from None
            if self.terminal:
                from ._pty import kill_session

                kill_session(self.pid, signum)

    def write_stdin(self, data: bytes, *, terminal: bool = False) -> None:
        """Write ``data`` to its stdin pipe, or (``terminal``) to its terminal.

        A terminal's master is non-blocking: a process that reads nothing gets
        ``TERMINAL_WAIT`` seconds to make room before the write fails (the caller's request
        never hangs on it).
        """
        with self.stdin_lock:
            if terminal != self.terminal:
                raise RpcError(
                    "failed_precondition",
                    f"process {self.pid} is a terminal: send its input as pty"
                    if self.terminal
                    else f"process {self.pid} has no terminal: send its input as stdin",
                )
            if self.stdin is None:
                raise RpcError(
                    "failed_precondition",
                    f"stdin of process {self.pid} is closed (start it with stdin: true)",
                )
            view = memoryview(data)
            deadline = time.monotonic() + TERMINAL_WAIT
            try:
                while view:
                    try:
                        view = view[os.write(self.stdin, view) :]
                    except BlockingIOError:
                        if not _writable(self.stdin, deadline):
                            raise RpcError(
                                "unavailable",
                                f"the terminal of process {self.pid} has not read its input "
                                f"for {TERMINAL_WAIT:g} s",
                            ) from None
            except OSError:  # EPIPE for a pipe, EIO for a terminal nobody holds any more
                raise RpcError(
                    "failed_precondition", f"process {self.pid} closed its stdin"
                ) from None

    def resize(self, rows: int, cols: int) -> None:
        """Set its terminal's size; failed_precondition if it has none."""
        from ._pty import resize

        with self.stdin_lock:
            if not self.terminal:
                raise RpcError(
                    "failed_precondition", f"process {self.pid} has no terminal to resize"
                )
            if self.stdin is None:
                raise RpcError("not_found", f"process {self.pid} has already exited")
            resize(self.stdin, rows, cols)

    def close_stdin(self) -> None:
        with self.stdin_lock:
            if self.terminal:
                raise RpcError(
                    "failed_precondition",
                    f"process {self.pid} is a terminal: send it an end of file (ctrl-D, "
                    "byte 4) as its input instead",
                )
            self._close_input()

    def _close_input(self) -> None:
        """Close its stdin pipe or its terminal's master (``stdin_lock`` held)."""
        if self.stdin is not None:
            os.close(self.stdin)
            self.stdin = None

    def _publish(self, event: dict[str, object]) -> None:
        frame = envelope(dumps({"event": event}).encode())
        if "end" in event:
            self.end_frame = frame  # before any reader can have it: readers test for it
        with self.lock:
            queues = list(self.subscribers)
        for queue in queues:
            timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            if not queue.put(frame, len(frame), timeout) and not queue.closed:
                self._kill_for_deadline()
                queue.put(frame, len(frame), 0.5)  # one last chance, then the reader lags

    def _kill_for_deadline(self) -> None:
        if self.deadline is not None and self.timeout is not None:
            self.deadline = None  # once
            try:  # noqa: SIM105 - contextlib costs memory
                os.killpg(self.pid, _SIGKILL)
            except OSError:
                pass  # already gone
            if self.terminal:
                from ._pty import kill_session

                kill_session(self.pid, _SIGKILL)
            self.timed_out = True


def _writable(fd: int, deadline: float) -> bool:
    """Wait until ``fd`` takes a write or ``deadline`` passes; whether it does."""
    import select

    poller = select.poll()
    poller.register(fd, _POLLOUT)
    return bool(poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))


def find(selector: dict[str, object] | None) -> Proc:
    if not selector:
        raise invalid("process selector (pid or tag) is required")
    pid, tag = selector.get("pid"), selector.get("tag")
    if isinstance(pid, str) and pid.isdigit():
        pid = int(pid)
    with _table_lock:
        if isinstance(pid, int) and not isinstance(pid, bool):
            proc = _table.get(pid)
        elif isinstance(tag, str):
            proc = next((p for p in _table.values() if p.tag == tag), None)
        else:
            raise invalid("process selector needs an integer pid or a string tag")
    if proc is None:
        raise RpcError("not_found", f"no running process matches {selector}")
    return proc


def listing() -> list[dict[str, object]]:
    with _table_lock:
        procs = list(_table.values())
    out: list[dict[str, object]] = []
    for proc in procs:
        info: dict[str, object] = {"config": proc.config, "pid": proc.pid}
        if proc.tag is not None:
            info["tag"] = proc.tag
        out.append(info)
    return out


def which(cmd: str, env: dict[str, str]) -> str:
    if "/" in cmd:
        return cmd
    for directory in (env.get("PATH") or os.defpath).split(":"):
        candidate = os.path.join(directory or ".", cmd)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise invalid(f"program {cmd!r} was not found in PATH")


def spawn(
    cmd: str,
    args: list[str],
    env: dict[str, str],
    cwd: str,
    *,
    stdin: bool,
    tag: str | None,
    config: dict[str, object],
    timeout: float | None,
    user: str = SANDBOX_USER,
    terminal: tuple[int, int] | None = None,
) -> tuple[Proc, Queue]:
    """Start the process as ``user`` with a first subscriber attached; raise RpcError if it
    cannot run. ``terminal`` is ``(rows, cols)`` for a process on a new pty (then ``stdin``
    is moot: a terminal always takes input)."""
    if not os.path.isdir(cwd):
        raise invalid(f"the working directory {cwd!r} does not exist or is not a directory")
    program = which(cmd, env)
    argv = [cmd, *args]
    if any("\0" in a for a in argv) or any("\0" in k + v or "=" in k for k, v in env.items()):
        raise invalid("arguments and environment must not contain NUL (or = in names)")
    if terminal is not None:
        _reserve_terminal()
    try:
        names, child, writer = _plumbing(stdin, terminal)
    except BaseException:
        if terminal is not None:
            _release_terminal()
        raise
    try:
        pid = _start(program, argv, env, cwd, child, user, terminal=terminal is not None)
    except OSError as exc:
        for fd in (*names, writer):
            if fd >= 0:
                os.close(fd)
        if terminal is not None:
            _release_terminal()
        raise RpcError(
            "permission_denied" if exc.errno in (1, 13) else "invalid_argument",
            f"cannot start {cmd!r}: {os.strerror(exc.errno or 0)}",
        ) from None
    finally:
        for fd in set(child):
            if fd >= 0:
                os.close(fd)
    proc = Proc(pid, config, tag)
    proc.stdin = writer if writer >= 0 else None
    proc.terminal = terminal is not None
    if timeout:
        proc.timeout = timeout
        proc.deadline = time.monotonic() + timeout
    queue = Queue(QUEUE_LIMIT)
    proc.subscribers.append(queue)
    with _table_lock:
        _table[pid] = proc
    start_thread(lambda: _pump(proc, names))
    return proc, queue


def _plumbing(
    stdin: bool, terminal: tuple[int, int] | None
) -> tuple[dict[int, str], tuple[int, int, int], int]:
    """The daemon's ends (fd → the output's name), the child's fds 0, 1 and 2 (-1: none),
    and the fd its input is written to (-1: none)."""
    if terminal is not None:
        from ._pty import open_terminal

        master, slave = open_terminal(*terminal)
        try:
            writer = os.dup(master)
        except OSError as exc:
            os.close(master)
            os.close(slave)
            why = f"cannot open a terminal: {exc.strerror}"
            raise RpcError("resource_exhausted", why) from None
        return {master: "pty"}, (slave, slave, slave), writer
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin else (-1, -1)
    return {out_r: "stdout", err_r: "stderr"}, (in_r, out_w, err_w), in_w


def _reserve_terminal() -> None:
    from ._pty import LIMIT

    with _table_lock:
        if _terminals[0] >= LIMIT:
            raise RpcError(
                "resource_exhausted",
                f"this sandbox already runs {LIMIT} terminals: kill one before opening another",
            )
        _terminals[0] += 1


def _release_terminal() -> None:
    with _table_lock:
        _terminals[0] -= 1


def _start(
    program: str,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    fds: tuple[int, int, int],
    user: str,
    *,
    terminal: bool = False,
) -> int:
    """Start ``program`` as ``user`` in a new session with ``fds`` as 0, 1 and 2 (stdin -1:
    /dev/null); return its pid. ``terminal``: the fds are one pty slave, which becomes the
    session's controlling terminal.

    posix_spawn (a vfork: no copy of the daemon's page tables) when the command runs in the
    daemon's own working directory as the daemon's own user without a terminal; fork
    otherwise (posix_spawn can neither change directory on every Python this runs on, nor
    change uid, nor take a controlling terminal). Exec failures (and a uid the kernel
    refused) raise OSError either way.
    """
    stdin, out, err = fds
    if cwd == _CWD and not switches(user) and not terminal:
        actions = [
            (os.POSIX_SPAWN_DUP2, stdin, 0)
            if stdin >= 0
            else (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, err, 2),
        ]
        return os.posix_spawn(
            program, argv, env, file_actions=actions, setsid=True, setsigdef=(13, 25)
        )
    if terminal:
        from ._pty import control  # imported before the fork: the child only calls
    gate_r, gate_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe-ish os calls until exec
        try:
            os.setsid()
            if terminal:
                control(stdin)
            else:
                null = os.open("/dev/null", os.O_RDONLY) if stdin < 0 else stdin
                os.dup2(null, 0)
                os.dup2(out, 1)
                os.dup2(err, 2)
            become(user)  # before chdir: the user's own permissions decide it
            os.chdir(cwd)
            _signal.signal(13, _signal.SIG_DFL)  # SIGPIPE: Python ignores it, programs expect it
            _signal.signal(25, _signal.SIG_DFL)  # SIGXFSZ
            os.execve(program, argv, env)
        except OSError as exc:
            os.write(gate_w, b"%d" % (exc.errno or 0))
        finally:
            os._exit(127)
    os.close(gate_w)
    failure = b""
    while True:  # exec closes the gate (CLOEXEC); a failure writes errno first
        chunk = os.read(gate_r, 64)
        if not chunk:
            break
        failure += chunk
    os.close(gate_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(int(failure) if failure.isdigit() else 0, "exec failed")
    return pid


def _pump(proc: Proc, names: dict[int, str]) -> None:
    """Publish what the fds in ``names`` yield (as ``data`` of that name) until the process
    has exited and they are drained; then reap it (``_finish``). Closes the fds."""
    import select

    owned = list(names)
    poller = select.poll()
    for fd in names:
        poller.register(fd, _POLLIN)
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, _POLLIN)
    except (AttributeError, OSError):
        pidfd = -1
    exited = False
    drained_after_exit = 0
    try:
        while names or not exited:
            timeout_ms = -1
            if proc.deadline is not None:
                timeout_ms = max(0, int((proc.deadline - time.monotonic()) * 1000) + 1)
            if not exited and pidfd < 0:
                timeout_ms = 50 if timeout_ms < 0 else min(timeout_ms, 50)
            if exited:
                timeout_ms = 0  # only what is already in the pipes: a grandchild may hold them
            events = poller.poll(timeout_ms)
            if proc.deadline is not None and time.monotonic() >= proc.deadline:
                proc._kill_for_deadline()
            if not events and exited:
                break
            for fd, _mask in events:
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited = True
                    continue
                try:
                    data = os.read(fd, _READ)
                except BlockingIOError:  # a terminal's master: another reader was faster
                    continue
                except OSError:  # EIO: a terminal whose every slave fd is closed
                    data = b""
                if not data:
                    poller.unregister(fd)
                    del names[fd]
                    continue
                proc._publish({"data": {names[fd]: b64encode(data)}})
                if exited:
                    drained_after_exit += len(data)
                    if drained_after_exit > 4 * _READ:
                        names.clear()
            if not exited and pidfd < 0:
                flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
                exited = os.waitid(os.P_PID, proc.pid, flags) is not None
    finally:
        for fd in (*owned, pidfd):
            if fd >= 0:
                os.close(fd)
        _finish(proc)


def _finish(proc: Proc) -> None:
    with proc.lock:
        proc.exited = True  # from here on no signal can reach a recycled pid
        _, status = os.waitpid(proc.pid, 0)
        proc.deadline = None
    end: dict[str, object] = {}
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        end = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    else:
        sig = os.WTERMSIG(status)
        name = _SIGNAL_NAMES.get(sig, f"signal {sig}")
        end = {"exitCode": -1, "exited": False, "status": f"signal: {name}"}
    if proc.timed_out:
        end["error"] = f"the command timed out after {proc.timeout:g} s and was killed"
    with proc.stdin_lock:
        proc._close_input()
    proc._publish({"end": end})
    with _table_lock:
        _table.pop(proc.pid, None)
    if proc.terminal:
        _release_terminal()
    with proc.lock:
        for queue in proc.subscribers:
            queue.close()
        proc.subscribers.clear()

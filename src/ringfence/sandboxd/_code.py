"""Code contexts: persistent interpreters in the sandbox, over E2B's code-interpreter protocol.

``POST /execute`` ``{"code", "context_id"?, "language"?, "env_vars"?, "timeout"?}`` answers a
stream of JSON lines (``stdout``, ``stderr``, ``result``, ``error``,
``number_of_executions``, ``end_of_execution``); ``/contexts`` creates, lists, restarts and
removes contexts. Each context is its own process (``_kernel`` for Python, a bash for
bash), started on first use: an idle daemon pays nothing for them. As E2B's, a python and
(with node) a javascript default context are listed from the start. Output goes in whole
lines (``_Lines``); a cell's ``env_vars`` hold for that cell only. One cell runs at a time
per context. A cell past its deadline gets SIGINT (the context survives, as in Jupyter); if
it does not stop within ``_GRACE`` seconds, its context is restarted and says so. Loaded
on the first code call only.
"""

from __future__ import annotations

import _thread
import codecs
import contextlib
import math
import os
import re
import secrets
import select
import signal
import socket
import time
from typing import Any

from ._codec import dumps, loads
from ._errors import RpcError, invalid
from ._http import Closed
from ._paths import resolve
from ._users import become, switches
from .methods import SANDBOX_USER

_LANGUAGES = ("python", "bash", "javascript")  # javascript: when the template has node
_ALIASES = {"js": "javascript", "py": "python", "sh": "bash"}
_GRACE = 2.0  # seconds an interrupted cell has to stop before its context is restarted
_PARTIAL = 0.2  # seconds a partial output line waits for its end (IPython's flush interval)
_READ = 65536
_MAX_CODE = 1 << 20
_MAX_CONTEXTS = 32
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BASH_END = "__ringfence_cell_done__"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_lock = _thread.allocate_lock()
_contexts: dict[str, Context] = {}
_defaults: dict[str, str] = {}  # language -> id of its default context
_DEFAULTS = ("python", "javascript")  # listed from the start, as E2B's
_made_defaults = False


class Context:
    """One interpreter. ``lazy``: its process starts with its first cell (a default context,
    listed from the start as E2B's are, costs nothing until used)."""

    def __init__(self, context_id: str, language: str, cwd: str, *, lazy: bool = False) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self.busy = _thread.allocate_lock()  # one cell at a time
        self.count = 0
        self.pid = -1
        self.started = False
        if not lazy:
            self._start()

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if self.language == "javascript":
            node = _which("node")
            if node is None:
                raise invalid("javascript needs node, which this sandbox's template lacks")
            argv = [node, os.path.join(_PACKAGE_PARENT, "sandboxd", "_kernel.js")]
            stdin: tuple[Any, ...] = (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)
        elif self.language == "python":
            boot = (
                f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
                "from sandboxd._kernel import main; main(3)"
            )
            argv = [_python(), "-u", "-c", boot]
            stdin = (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)
        else:
            argv = ["/bin/bash", "--noprofile", "--norc", "-s"]
            stdin = (os.POSIX_SPAWN_DUP2, theirs.fileno(), 0)  # the cells, on stdin
        env = dict(os.environ)
        env.setdefault("MPLBACKEND", "Agg")
        try:
            if not os.path.isdir(self.cwd):
                raise invalid(f"cwd {self.cwd!r} is not a directory")
            self.pid = _spawn_in(
                self.cwd,
                argv,
                env,
                [stdin, (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
                 (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3)],
            )  # fmt: skip
        except OSError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            ours.close()
            raise RpcError("internal", f"cannot start a {self.language} context: {exc}") from None
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
        self.channel = ours
        self.out, self.err = out_r, err_r
        self.buffer = b""
        self.started = True

    def stop(self) -> None:
        # The group, and the interpreter itself should its code have left the group: the
        # waitpid below must not wait for a process that was never killed.
        if self.pid > 0:  # never -1 (every process there): a start that failed
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(self.pid, 0)
        self.pid = -1  # reaped: its number may be another process's now
        if self.started:
            self.started = False
            self.channel.close()
            for fd in (self.out, self.err):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def start(self) -> None:
        """Start the interpreter of a lazy context (a no-op once started).

        Raises:
            RpcError: it cannot start (``invalid_argument``: its cwd is gone, no node).
        """
        if not self.started:
            self._start()

    def restart(self) -> None:
        """A fresh interpreter; one that never started stays so until its first cell."""
        was_started = self.started
        self.stop()
        self.count = 0
        if was_started:
            self._start()

    def run(
        self, code: str, env: dict[str, str], timeout: float | None, emit: Any, client: Any = None
    ) -> None:
        """Run one cell, passing each output line (a dict) to ``emit`` as it comes.

        ``client``: the connection asking (a ``Conn``). Should it go away (closed, or the
        cell's output cannot be sent), the cell is interrupted as at a deadline: nobody will
        read what it does, and its context must be free for the next cell.
        """
        if self.language != "bash":
            self.channel.sendall(dumps({"code": code, "env": env}).encode() + b"\n")
        else:
            self.channel.sendall(_bash_cell(code, env).encode())
        deadline = None if not timeout else time.monotonic() + timeout
        interrupted_at: float | None = None
        poller = select.poll()
        names = {self.out: "stdout", self.err: "stderr", self.channel.fileno(): "control"}
        for fd in names:
            poller.register(fd, select.POLLIN)
        if client is not None:
            names[client.sock.fileno()] = "client"
            poller.register(client.sock.fileno(), select.POLLRDHUP)
        gone = False

        def send(message: dict[str, Any]) -> None:
            nonlocal gone
            if not gone:
                try:
                    emit(message)
                except Closed:
                    gone = True

        streams = {self.out: _Lines("stdout", send), self.err: _Lines("stderr", send)}
        while True:
            if gone and interrupted_at is None:
                if client is not None:
                    with contextlib.suppress(KeyError):
                        poller.unregister(client.sock.fileno())
                interrupted_at = time.monotonic()
                _interrupt(self)
            limit = deadline if interrupted_at is None else interrupted_at + _GRACE
            timers = [t for t in (limit, *(lines.due for lines in streams.values())) if t]
            now = time.monotonic()
            wait = -1 if not timers else max(0, math.ceil((min(timers) - now) * 1000))
            events = poller.poll(wait)
            now = time.monotonic()
            for lines in streams.values():
                if lines.due is not None and lines.due <= now:
                    lines.flush()  # a partial line, waiting too long for its end
            if not events:
                if limit is None or now < limit:
                    continue  # a partial line's flush woke us
                if interrupted_at is None:
                    interrupted_at = time.monotonic()
                    _interrupt(self)
                    continue
                for lines in streams.values():
                    lines.flush(final=True)
                self.restart()
                why = "its client went away" if gone else f"it ran past its {timeout:g} s deadline"
                send({"type": "error", "name": "TimeoutError",
                      "value": f"the cell did not stop when interrupted ({why}): its context "
                               "was restarted (its state is lost)",
                      "traceback": ""})  # fmt: skip
                return
            for fd, mask in events:
                if names[fd] == "client":
                    gone = (
                        gone
                        or bool(mask & (select.POLLHUP | select.POLLERR))
                        or (client.peer_closed())
                    )
                    continue
                if names[fd] != "control":
                    streams[fd].feed(os.read(fd, _READ))
                    continue
                self._drain(streams)  # what the cell printed before this result or error
                done = self._control(send)
                if done is not None:
                    self._drain(streams, final=True)
                    self.count = done if self.language != "bash" else self.count + 1
                    if interrupted_at is not None and self.language == "bash":
                        send({"type": "error", "name": "KeyboardInterrupt",
                              "value": "interrupted at its deadline", "traceback": ""})  # fmt: skip
                    return

    def _control(self, emit: Any) -> int | None:
        """Handle what the context says; the cell's execution count once it is done."""
        data = self.channel.recv(_READ)
        if not data:
            self.restart()
            emit({"type": "error", "name": "ContextDied",
                  "value": "the context's process died (out of memory?); it was restarted",
                  "traceback": ""})  # fmt: skip
            return 0
        self.buffer += data
        done = None
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if self.language == "bash":
                if line.startswith(_BASH_END.encode()):
                    status = int(line.split()[-1] or 0)
                    if status:
                        emit({"type": "error", "name": "ExitStatus", "value": str(status),
                              "traceback": ""})  # fmt: skip
                    done = self.count + 1
                continue
            message = loads(line)
            if message.get("type") == "done":
                done = int(message.get("execution_count", self.count + 1))
            else:
                emit(message)
        return done

    def _drain(self, streams: dict[int, _Lines], *, final: bool = False) -> None:
        """Pass on what the pipes hold now, partial lines too: the kernel wrote it before
        what it says on its channel. ``final``: the cell has ended."""
        for fd, lines in streams.items():
            with contextlib.suppress(OSError):  # a context that died and was restarted
                while select.select([fd], [], [], 0)[0]:
                    data = os.read(fd, _READ)
                    if not data:
                        break
                    lines.feed(data)
            lines.flush(final=final)


class _Lines:
    """A cell's stdout or stderr, passed on in whole lines, as IPython's kernel does.

    ``print(1)`` writes ``1`` and the newline apart, and a pipe read may cut anywhere: a
    message ends at a newline. A line still without its end after ``_PARTIAL`` seconds
    (a progress bar, a prompt) or ``_READ`` bytes goes as it is, and so does the rest once
    the cell ends; bytes are decoded incrementally, so no character is cut either.
    """

    def __init__(self, name: str, send: Any) -> None:
        self.name = name
        self.send = send
        self.pending = b""
        self.due: float | None = None  # when the partial line in ``pending`` goes anyway
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.pending += data
        cut = self.pending.rfind(b"\n") + 1
        if not cut and len(self.pending) >= _READ:
            cut = len(self.pending)  # one long line: it goes in pieces, memory stays bounded
        if cut:
            self._pass(self.pending[:cut])
            self.pending = self.pending[cut:]
        if not self.pending:
            self.due = None
        elif cut or self.due is None:
            self.due = time.monotonic() + _PARTIAL

    def flush(self, *, final: bool = False) -> None:
        """Pass on what is pending, a partial line too; ``final``: the stream's end."""
        data, self.pending, self.due = self.pending, b"", None
        self._pass(data, final=final)

    def _pass(self, data: bytes, *, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        if text:
            self.send({"type": self.name, "text": text, "timestamp": _now()})


def create(language: str | None, cwd: str | None) -> Context:
    language = (language or "python").lower()
    language = _ALIASES.get(language, language)
    if language not in _LANGUAGES:
        raise invalid(f"language {language!r} is not available here (only {', '.join(_LANGUAGES)})")
    with _lock:
        if len(_contexts) >= _MAX_CONTEXTS:
            raise RpcError("resource_exhausted", f"at most {_MAX_CONTEXTS} contexts per sandbox")
    context = Context(secrets.token_hex(8), language, resolve(cwd or os.environ.get("HOME", "/")))
    with _lock:
        _contexts[context.id] = context
    return context


def find(context_id: str) -> Context:
    with _lock:
        context = _contexts.get(context_id)
    if context is None:
        raise RpcError("not_found", f"no context {context_id!r}")
    return context


def default(language: str | None) -> Context:
    """The language's default context (what ``/execute`` with only a language runs in),
    made on first use; python's and javascript's exist from the start (``_listed``)."""
    language = (language or "python").lower()
    language = _ALIASES.get(language, language)
    _listed()
    with _lock:
        context_id = _defaults.get(language)
    if context_id is not None:
        try:
            return find(context_id)
        except RpcError:
            pass
    context = create(language, None)
    with _lock:
        _defaults[language] = context.id
    return context


def _listed() -> None:
    """Register the default python and javascript contexts (javascript when the template
    has node), as E2B's code interpreter starts both: listed from the first call, their
    processes started by their first cell. Once only: a removed default stays removed
    until a cell in its language makes a new one."""
    global _made_defaults
    with _lock:
        if _made_defaults:
            return
        _made_defaults = True
        for language in _DEFAULTS:
            if language == "javascript" and _which("node") is None:
                continue
            cwd = resolve(os.environ.get("HOME", "/"))
            context = Context(secrets.token_hex(8), language, cwd, lazy=True)
            _contexts[context.id] = context
            _defaults[language] = context.id


def remove(context_id: str) -> None:
    context = find(context_id)
    with _lock:
        _contexts.pop(context_id, None)
    with context.busy:
        context.stop()


def listing() -> list[dict[str, str]]:
    _listed()
    with _lock:
        return [context.describe() for context in _contexts.values()]


# -- HTTP ---------------------------------------------------------------------------------------

_JSON = [("Content-Type", "application/json")]


def serve(request: Any, conn: Any) -> None:
    """Route /execute and /contexts[...]."""
    path, method = request.path, request.method
    try:
        if path == "/execute" and method == "POST":
            _execute(request, conn)
        elif path == "/contexts" and method == "POST":
            body = _json_body(request)
            context = create(body.get("language"), body.get("cwd"))
            conn.respond(200, _JSON, dumps(context.describe()).encode())
        elif path == "/contexts" and method == "GET":
            conn.respond(200, _JSON, dumps(listing()).encode())
        elif path.startswith("/contexts/"):
            parts = path.split("/")[2:]
            if len(parts) == 1 and method == "DELETE":
                remove(parts[0])
                conn.respond(204, [])
            elif len(parts) == 2 and parts[1] == "restart" and method == "POST":
                context = find(parts[0])
                with context.busy:
                    context.restart()
                conn.respond(204, [])
            else:
                raise RpcError("not_found", f"no route for {method} {path}")
        else:
            raise RpcError("not_found", f"no route for {method} {path}")
    except RpcError as err:
        status = {"not_found": 404, "invalid_argument": 400, "resource_exhausted": 429}
        conn.respond(status.get(err.code, 500), _JSON,
                     dumps({"code": err.code, "message": err.message}).encode())  # fmt: skip


def _execute(request: Any, conn: Any) -> None:
    body = _json_body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise invalid("code: a string is required")
    if body.get("context_id") and body.get("language"):
        raise invalid("give context_id or language, not both")
    env = body.get("env_vars") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise invalid("env_vars: an object of strings is expected")
    timeout = body.get("timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise invalid("timeout: a positive number of seconds is expected")
    context = find(body["context_id"]) if body.get("context_id") else default(body.get("language"))
    if context.language == "bash":
        for name in env:
            if not _IDENTIFIER.fullmatch(str(name)):
                raise invalid(f"env_vars: {name!r} is not a name bash can export")

    def emit(message: dict[str, Any]) -> None:
        conn.send_chunk(dumps(message).encode() + b"\n")

    with context.busy:
        context.start()  # a default context's first cell: a failure is still a 4xx
        conn.start_chunked(200, "application/json")
        context.run(code, {str(k): v for k, v in env.items()}, timeout, emit, client=conn)
    emit({"type": "number_of_executions", "execution_count": context.count})
    emit({"type": "end_of_execution"})
    conn.end_chunked()


def _json_body(request: Any) -> dict[str, Any]:
    raw = request.body.read_all(_MAX_CODE)
    if raw is None:
        raise invalid(f"the request body is larger than {_MAX_CODE} bytes")
    if not raw.strip():
        return {}
    try:
        body = loads(raw)
    except ValueError:
        raise invalid("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def _interrupt(context: Context) -> None:
    if context.pid <= 0:  # not running (a restart that failed): nothing to interrupt
        return
    target = context.pid if context.language != "bash" else -context.pid
    try:
        if target > 0:
            os.kill(target, signal.SIGINT)
        else:
            os.killpg(-target, signal.SIGINT)
    except OSError:
        pass


def _spawn_in(cwd: str, argv: list[str], env: dict[str, str], actions: list[Any]) -> int:
    """posix_spawn in ``cwd`` (a fork when that is not the daemon's own directory).

    Either way the pid is returned only once the child runs the program in its own session:
    a context stopped at once (a restart, then a remove) is then killed by its group, where
    a child still between fork and setsid escaped the kill and its waitpid hung.

    Raises:
        OSError: the program could not be run.
    """
    if cwd == os.getcwd() and not switches(SANDBOX_USER):
        return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                              setsigdef=(signal.SIGPIPE, signal.SIGINT))  # fmt: skip
    gate_r, gate_w = os.pipe()  # close-on-exec: it closes when the exec succeeds
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            become(SANDBOX_USER)  # contexts run as the sandbox user, never as root
            os.chdir(cwd)
            for action in actions:
                if action[0] == os.POSIX_SPAWN_OPEN:
                    fd = os.open(action[2], action[3], action[4])
                    os.dup2(fd, action[1])
                else:
                    os.dup2(action[1], action[2])
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, env)
        except OSError as exc:
            os.write(gate_w, b"%d" % (exc.errno or 0))
        finally:
            os._exit(127)
    os.close(gate_w)
    failure = b""
    while chunk := os.read(gate_r, 64):
        failure += chunk
    os.close(gate_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(int(failure) if failure.isdigit() else 0, "exec failed")
    return pid


def _which(program: str) -> str | None:
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _python() -> str:
    import sys

    return sys.executable or "/usr/bin/python3"


def _bash_cell(code: str, env: dict[str, str]) -> str:
    """The cell as bash reads it on stdin: ``env`` exported for this cell only (each name's
    earlier value, or its absence, is back once the cell ends, as the Python kernel does),
    then the end marker with the cell's status on the control channel (fd 3). The names
    are shell identifiers (``_execute`` checks)."""
    before, after = [], []
    for i, (name, value) in enumerate(env.items()):
        had, was = f"__ringfence_had_{i}", f"__ringfence_was_{i}"
        before.append(
            f"{had}=${{{name}+1}} {was}=${{{name}-}}; export {name}={_shell_quote(value)}\n"
        )
        after.append(
            f'if [ -n "${had}" ]; then {name}=${was}; else unset {name}; fi; unset {had} {was}\n'
        )
    status = "__ringfence_status"
    return (
        "".join(before) + f"{code}\n{status}=$?\n" + "".join(after)
        + f"printf '{_BASH_END} %d\\n' \"${status}\" >&3; unset {status}\n"
    )  # fmt: skip


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"

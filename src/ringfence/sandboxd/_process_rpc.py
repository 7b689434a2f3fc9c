"""The ``process.Process`` service (E2B envd's process API).

``Start`` streams ``start{pid}``, then ``data{stdout|stderr}`` as produced, then
``end{exitCode, exited, status, error?}``; ``keepalive{}`` every ``keepalive-ping-interval``
seconds while idle. A program or working directory that does not exist is refused before
``start`` with ``invalid_argument`` (the E2B SDK raises ``InvalidArgumentException`` with the
message); an exec permission error is ``permission_denied``.

Deadline: ``StartRequest.timeoutMs`` (a Ringfence extension), else the ``connect-timeout-ms``
header. At the deadline the process group is killed with SIGKILL. With ``timeoutMs`` the
stream then ends with ``end{exitCode: -1, exited: false, status: "signal: killed", error:
"the command timed out ..."}``; with the header's deadline it ends as envd's does, with the
Connect error ``deadline_exceeded`` (the E2B SDKs' ``TimeoutException``). E2B's SDK sends
``connect-timeout-ms`` = its ``timeout`` (60 s by default), also for background commands:
pass ``timeout=0`` for a command that must outlive a minute.

A client leaving the ``Start`` stream does not kill the process; ``Connect`` re-attaches
(output from that moment on, no replay), and any number of streams may follow one process.

Terminals: ``Start`` with ``pty{size{rows, cols}}`` runs the process on a new pty of that
size (see ``_pty``); its output streams as ``data{pty}``, ``SendInput``/``StreamInput`` take
``input{pty}``, ``Update{pty{size}}`` resizes it, ``SendSignal`` reaches its whole session.
Terminal input to a process without one (and stdin to a terminal) is
``failed_precondition``; a sandbox running ``_pty.LIMIT`` terminals refuses another with
``resource_exhausted``.
"""

from __future__ import annotations

import os
import time

from . import _process, _users
from ._codec import (
    msg_bool,
    msg_bytes,
    msg_dict,
    msg_enum,
    msg_int,
    msg_str,
    msg_str_list,
    msg_str_map,
)
from ._connect import envelope
from ._errors import RpcError, invalid
from ._paths import home, resolve
from ._sync import Queue

__all__ = [
    "close_stdin",
    "connect",
    "list_processes",
    "send_input",
    "send_signal",
    "start",
    "stream_input",
    "update",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._codec import Msg
    from ._rpc import Call

_SIGNALS = {"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}
_KEEPALIVE = envelope(b'{"event":{"keepalive":{}}}')


def start(call: Call) -> None:
    msg = call.message
    pty = msg_dict(msg, "pty")
    terminal = None
    if pty is not None:
        from ._pty import size_of

        terminal = size_of(pty)
    process = msg_dict(msg, "process") or {}
    cmd = msg_str(process, "cmd")
    if not cmd:
        raise invalid("process.cmd is required")
    args = msg_str_list(process, "args")
    envs = msg_str_map(process, "envs")
    cwd_given = msg_str(process, "cwd")
    tag = msg_str(msg, "tag")
    timeout_ms = msg_int(msg, "timeout_ms", maximum=10**12)
    timeout = timeout_ms / 1000 if timeout_ms else call.timeout
    user = _users.current()
    env = _users.env_for(user, dict(os.environ))
    cwd = resolve(cwd_given, "process.cwd") if cwd_given else env.get("HOME") or home()
    env.update(envs)
    config: dict[str, object] = {"cmd": cmd, "args": args}
    if envs:
        config["envs"] = envs
    if cwd_given:
        config["cwd"] = cwd_given
    proc, queue = _process.spawn(
        cmd,
        args,
        env,
        cwd,
        stdin=bool(msg_bool(msg, "stdin")),
        tag=tag,
        config=config,
        timeout=timeout,
        user=user,
        terminal=terminal,
    )
    _follow(call, proc, queue, None, deadline_ends_stream=not timeout_ms)


def connect(call: Call) -> None:
    proc = _process.find(msg_dict(call.message, "process"))
    queue = proc.subscribe()
    if queue is None:
        raise RpcError("not_found", f"process {proc.pid} has already exited")
    deadline = None if call.timeout is None else time.monotonic() + call.timeout
    _follow(call, proc, queue, deadline)


def _follow(
    call: Call,
    proc: _process.Proc,
    queue: Queue,
    deadline: float | None,
    *,
    deadline_ends_stream: bool = False,
) -> None:
    """Send the process's events to the caller until its end (or the caller leaves).

    ``deadline_ends_stream``: the process's deadline is this stream's own (the
    ``connect-timeout-ms`` it came with), so a process killed for it ends the stream as
    envd's handler does when its context expires: ``deadline_exceeded``, not an end event.
    """
    try:
        call.send({"event": {"start": {"pid": proc.pid}}})
        while True:
            wait = call.keepalive
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise RpcError("deadline_exceeded", "the Connect stream reached its deadline")
            item = queue.get(wait)
            if item is Queue.CLOSED:
                return
            if deadline_ends_stream and item is proc.end_frame and proc.timed_out:
                raise RpcError(
                    "deadline_exceeded",
                    f"context deadline exceeded: the command ran past its {proc.timeout:g} s "
                    "timeout and was killed",
                )
            call.send_raw(_KEEPALIVE if item is None else item)  # type: ignore[arg-type]
    finally:
        proc.unsubscribe(queue)


def list_processes(call: Call) -> Msg:
    return {"processes": _process.listing()}


def send_input(call: Call) -> Msg:
    proc = _process.find(msg_dict(call.message, "process"))
    _write_input(proc, msg_dict(call.message, "input") or {})
    return {}


def _write_input(proc: _process.Proc, data: Msg) -> None:
    if data.get("stdin") is not None and data.get("pty") is not None:
        raise invalid("input is one of stdin and pty, not both")
    terminal = data.get("pty") is not None
    payload = msg_bytes(data, "pty" if terminal else "stdin")
    if payload:
        proc.write_stdin(payload, terminal=terminal)


def close_stdin(call: Call) -> Msg:
    _process.find(msg_dict(call.message, "process")).close_stdin()
    return {}


def send_signal(call: Call) -> Msg:
    proc = _process.find(msg_dict(call.message, "process"))
    signum = msg_enum(call.message, "signal", _SIGNALS)
    if not signum:
        raise invalid("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
    proc.signal(signum)
    return {}


def stream_input(call: Call) -> Msg:
    proc: _process.Proc | None = None
    while True:
        msg = call.receive()
        if msg is None:
            return {}
        event = msg_dict(msg, "start"), msg_dict(msg, "data")
        if event[0] is not None:
            proc = _process.find(msg_dict(event[0], "process"))
        elif event[1] is not None:
            if proc is None:
                raise invalid("StreamInput must begin with a start event naming the process")
            _write_input(proc, msg_dict(event[1], "input") or {})


def update(call: Call) -> Msg:
    proc = _process.find(msg_dict(call.message, "process"))
    pty = msg_dict(call.message, "pty")
    if pty is None:
        return {}  # nothing to change (envd's Update changes only a terminal's size)
    from ._pty import size_of

    proc.resize(*size_of(pty))
    return {}

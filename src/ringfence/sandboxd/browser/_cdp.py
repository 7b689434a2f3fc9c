"""A Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

Chromium reads commands from its fd 3 and writes responses and events to its fd 4, each
message one JSON object followed by a NUL byte. ``Connection`` owns our ends of those two
pipes: ``call`` sends a command (with a ``sessionId`` for a tab attached in flattened
mode) and waits for its answer, never longer than the deadline it is given; a reader
thread parses what Chromium writes, hands answers to their callers and events to the
listener of their session. When the pipe ends (Chromium died) every waiting call and
every later one raises ``Gone``.

A message larger than ``MAX_MESSAGE`` breaks the protocol (the agent would otherwise hold
whatever a hostile page makes Chromium serialise): the connection ends as if Chromium had
died, and the agent replaces it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 96 * 1024 * 1024
_CHUNK = 1 << 20

Listener = Callable[[str, dict[str, Any]], None]


class Deadline:
    """A point in monotonic time; ``left()`` is what remains of it, in seconds."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def sooner(self, seconds: float) -> Deadline:
        """This deadline or one ``seconds`` from now, whichever comes first."""
        other = Deadline(seconds)
        return other if other.at < self.at else self


class ProtocolError(Exception):
    """Chromium answered a command with an error (``{"error": {...}}``)."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.method = method
        self.code = error.get("code")
        self.text = str(error.get("message", ""))
        super().__init__(f"{method}: {self.text}")


class Gone(Exception):
    """The pipe to Chromium ended: it exited, was killed, or broke the protocol."""


class Expired(Exception):
    """A call's deadline passed before Chromium answered."""


class Connection:
    """Our ends of the pipes: ``commands`` (Chromium's fd 3), ``replies`` (its fd 4)."""

    def __init__(self, commands: int, replies: int) -> None:
        self._commands = commands
        self._replies = replies
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, _Slot] = {}
        self._listeners: dict[str, Listener] = {}
        self._gone: str | None = None
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()

    @property
    def gone(self) -> str | None:
        """Why the connection ended, or ``None`` while it is up."""
        return self._gone

    def listen(self, session_id: str, listener: Listener | None) -> None:
        """Route events of ``session_id`` ("" for the browser's own) to ``listener`` (or
        stop routing them). It runs on the reader thread: it must not block or call."""
        with self._lock:
            if listener is None:
                self._listeners.pop(session_id, None)
            else:
                self._listeners[session_id] = listener

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        deadline: Deadline,
    ) -> dict[str, Any]:
        """Send ``method`` and return its result.

        Raises:
            ProtocolError: Chromium refused the command.
            Expired: ``deadline`` passed first (the answer, if it comes, is dropped).
            Gone: the connection ended.
        """
        slot = _Slot()
        with self._lock:
            if self._gone is not None:
                raise Gone(self._gone)
            self._next_id += 1
            ident = self._next_id
            self._waiting[ident] = slot
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            self._write(json.dumps(message).encode() + b"\0")
            if not slot.done.wait(max(0.0, deadline.left())):
                raise Expired(method)
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        if slot.gone is not None:
            raise Gone(slot.gone)
        if slot.error is not None:
            raise ProtocolError(method, slot.error)
        return slot.result

    def send(self, method: str, params: dict[str, Any], *, session: str | None = None) -> None:
        """Send ``method`` without waiting for its answer (listeners may: they run on the
        reader thread, which a waiting ``call`` would deadlock). Errors are dropped."""
        with self._lock:
            if self._gone is not None:
                return
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        with contextlib.suppress(Gone):
            self._write(json.dumps(message).encode() + b"\0")

    def close(self, why: str = "closed") -> None:
        """End the connection (Chromium sees EOF on its fd 3) and fail every waiting call."""
        self._end(why)
        with contextlib.suppress(OSError):
            os.close(self._commands)

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._commands, view) :]
            except OSError as exc:
                self._end(f"writing to Chromium failed: {exc}")
                raise Gone(self._gone or "gone") from exc

    def _read(self) -> None:
        buffer = bytearray()
        why = "Chromium closed its end of the pipe"
        try:
            while True:
                chunk = os.read(self._replies, _CHUNK)
                if not chunk:
                    break
                start = len(buffer)
                buffer += chunk
                end = buffer.find(b"\0", start)
                while end >= 0:
                    self._dispatch(bytes(buffer[:end]))
                    del buffer[: end + 1]
                    end = buffer.find(b"\0")
                if len(buffer) > MAX_MESSAGE:
                    why = f"a message from Chromium exceeded {MAX_MESSAGE >> 20} MiB"
                    break
        except OSError as exc:
            why = f"reading from Chromium failed: {exc}"
        finally:
            self._end(why)
            with contextlib.suppress(OSError):
                os.close(self._replies)

    def _dispatch(self, raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        ident = message.get("id")
        if isinstance(ident, int):
            with self._lock:
                slot = self._waiting.get(ident)
            if slot is not None:
                if isinstance(message.get("error"), dict):
                    slot.error = message["error"]
                else:
                    result = message.get("result")
                    slot.result = result if isinstance(result, dict) else {}
                slot.done.set()
            return
        method = message.get("method")
        if isinstance(method, str):
            with self._lock:
                listener = self._listeners.get(str(message.get("sessionId", "")))
            params = message.get("params")
            if listener is not None:
                listener(method, params if isinstance(params, dict) else {})

    def _end(self, why: str) -> None:
        with self._lock:
            if self._gone is None:
                self._gone = why
            slots = list(self._waiting.values())
        for slot in slots:
            slot.gone = self._gone
            slot.done.set()


class _Slot:
    __slots__ = ("done", "error", "gone", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] = {}
        self.error: dict[str, Any] | None = None
        self.gone: str | None = None

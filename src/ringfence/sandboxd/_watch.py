"""Directory watches through inotify (``ctypes``, imported on the first watch).

``WatchDir`` streams ``start{}``, then ``filesystem{name, type}`` events (``name`` relative
to the watched directory), with keepalives. ``CreateWatcher`` / ``GetWatcherEvents`` /
``RemoveWatcher`` are the polling variant: events wait in the kernel's inotify queue
(bounded by ``fs.inotify.max_queued_events``; an overflow is reported as an error) until the
next ``GetWatcherEvents``. With ``recursive``, subdirectories get watches as they appear;
in the polling variant that happens at the next poll, so events inside a directory created
between two polls can be missed. At most MAX_WATCHERS polling watchers live at once.
"""

from __future__ import annotations

import _thread
import os
import time

from ._codec import msg_bool, msg_str
from ._connect import envelope
from ._errors import RpcError, from_os_error, invalid
from ._paths import resolve

__all__ = ["create_watcher", "get_watcher_events", "remove_watcher", "watch_dir"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._codec import Msg
    from ._rpc import Call

MAX_WATCHERS = 64
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ISDIR, _IN_ONLYDIR = 0x4000, 0x8000, 0x40000000, 0x01000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_TYPES = (
    (_IN_CREATE | _IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (_IN_MOVED_FROM, "EVENT_TYPE_RENAME"),
    (_IN_ATTRIB, "EVENT_TYPE_CHMOD"),
    (_IN_MODIFY, "EVENT_TYPE_WRITE"),
    (_IN_DELETE, "EVENT_TYPE_REMOVE"),
)
_KEEPALIVE = envelope(b'{"keepalive":{}}')
_libc: object = None


def _inotify() -> object:
    global _libc
    if _libc is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1  # noqa: B018 - probe that the symbol exists
        except (ImportError, OSError, AttributeError):
            raise RpcError(
                "unimplemented", "directory watches need inotify, which is unavailable here"
            ) from None
        _libc = libc
    return _libc


class Watch:
    """An inotify instance watching one directory (and, if recursive, its subdirectories)."""

    def __init__(self, path: str, recursive: bool) -> None:
        import ctypes

        self.libc: ctypes.CDLL = _inotify()  # type: ignore[assignment]
        self.path = path
        self.recursive = recursive
        self.dirs: dict[int, str] = {}  # watch descriptor → path relative to the root
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise from_os_error(OSError(err, os.strerror(err)), "create an inotify instance")
        self.fd: int = fd
        try:
            self._add("")
            if recursive:
                for root, subdirs, _ in os.walk(path):
                    for sub in subdirs:
                        self._add(os.path.relpath(os.path.join(root, sub), path))
        except BaseException:
            os.close(fd)
            raise

    def _add(self, rel: str) -> None:
        import ctypes

        full = os.path.join(self.path, rel) if rel else self.path
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(full), _MASK | _IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            if rel:  # a subdirectory that vanished or cannot be read: skip it
                if err == 28:  # ENOSPC: out of inotify watches
                    raise RpcError("resource_exhausted", "the sandbox ran out of inotify watches")
                return
            raise from_os_error(OSError(err, os.strerror(err)), f"watch {full}")
        self.dirs[wd] = rel

    def read(self) -> list[Msg]:
        """Events available now (non-blocking)."""
        events: list[Msg] = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return events
            offset = 0
            while offset + 16 <= len(data):
                wd = int.from_bytes(data[offset : offset + 4], "little", signed=True)
                mask = int.from_bytes(data[offset + 4 : offset + 8], "little")
                size = int.from_bytes(data[offset + 12 : offset + 16], "little")
                raw = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
                offset += 16 + size
                if mask & _IN_Q_OVERFLOW:
                    raise RpcError("resource_exhausted", "too many file events: queue overflow")
                if mask & _IN_IGNORED:
                    self.dirs.pop(wd, None)
                    continue
                if wd not in self.dirs or not raw:
                    continue
                parent = self.dirs[wd]
                name = os.fsdecode(raw)
                rel = os.path.join(parent, name) if parent else name
                if self.recursive and mask & _IN_ISDIR and mask & (_IN_CREATE | _IN_MOVED_TO):
                    self._add(rel)
                for bit, kind in _TYPES:
                    if mask & bit:
                        events.append({"name": rel, "type": kind})

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open(msg: Msg) -> Watch:
    path = resolve(msg_str(msg, "path"))
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise invalid(f"{path} is not a directory")
        raise RpcError("not_found", f"directory {path} does not exist")
    return Watch(path, bool(msg_bool(msg, "recursive")))


def watch_dir(call: Call) -> None:
    import select

    watch = _open(call.message)
    try:
        call.send({"start": {}})
        poller = select.poll()
        poller.register(watch.fd, select.POLLIN)
        client = call.conn.sock.fileno()
        rdhup = getattr(select, "POLLRDHUP", 0)
        hangup = select.POLLHUP | select.POLLERR | rdhup
        poller.register(client, select.POLLIN | rdhup)  # the client hanging up
        keepalive = call.keepalive
        last = time.monotonic()
        while True:
            ready = poller.poll(max(0, int((last + keepalive - time.monotonic()) * 1000)))
            for fd, mask in ready:
                if fd != client:
                    continue
                if mask & hangup or call.conn.peer_closed():
                    return
                # serve_call read the request body to its end: these bytes are a pipelined
                # next request. They wait; from now on only a hangup wakes the loop.
                if rdhup:
                    poller.modify(client, rdhup)
                else:
                    poller.unregister(client)
            events = watch.read()
            for event in events:
                call.send({"filesystem": event})
            if events or time.monotonic() - last >= keepalive:
                if not events:
                    call.send_raw(_KEEPALIVE)
                last = time.monotonic()
    finally:
        watch.close()


_watchers_lock = _thread.allocate_lock()
_watchers: dict[str, Watch] = {}


def create_watcher(call: Call) -> Msg:
    with _watchers_lock:
        if len(_watchers) >= MAX_WATCHERS:
            raise RpcError(
                "resource_exhausted", f"at most {MAX_WATCHERS} watchers; remove unused ones"
            )
    watch = _open(call.message)
    watcher_id = os.urandom(8).hex()
    with _watchers_lock:
        _watchers[watcher_id] = watch
    return {"watcherId": watcher_id}


def _watcher(call: Call) -> tuple[str, Watch]:
    watcher_id = msg_str(call.message, "watcher_id") or ""
    with _watchers_lock:
        watch = _watchers.get(watcher_id)
    if watch is None:
        raise RpcError("not_found", f"no watcher {watcher_id!r}")
    return watcher_id, watch


def get_watcher_events(call: Call) -> Msg:
    _, watch = _watcher(call)
    return {"events": watch.read()}


def remove_watcher(call: Call) -> Msg:
    watcher_id, watch = _watcher(call)
    with _watchers_lock:
        _watchers.pop(watcher_id, None)
    watch.close()
    return {}

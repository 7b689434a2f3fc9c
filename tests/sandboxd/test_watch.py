"""Directory watches, streamed and polled."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

from .conftest import Daemon, parse_frames, wait_for

FS = "filesystem.Filesystem"


def test_watch_dir_streams_create_write_remove(daemon: Daemon) -> None:
    root = daemon.home / "watched"
    (root / "sub").mkdir(parents=True)
    events: list[dict[str, Any]] = []
    started = threading.Event()

    def follow() -> None:
        for message in daemon.stream(f"{FS}/WatchDir", {"path": "watched", "recursive": True}):
            if "start" in message:
                started.set()
            if "filesystem" in message:
                events.append(message["filesystem"])
            if any(e["type"] == "EVENT_TYPE_REMOVE" for e in events):
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert started.wait(10)
    (root / "sub" / "f.txt").write_text("x")
    wait_for(lambda: any(e["type"] == "EVENT_TYPE_WRITE" for e in events))
    (root / "sub" / "f.txt").unlink()
    thread.join(10)
    kinds = [(e["name"], e["type"]) for e in events]
    assert ("sub/f.txt", "EVENT_TYPE_CREATE") in kinds
    assert ("sub/f.txt", "EVENT_TYPE_WRITE") in kinds
    assert ("sub/f.txt", "EVENT_TYPE_REMOVE") in kinds


def test_polling_watcher(daemon: Daemon) -> None:
    root = daemon.home / "polled"
    root.mkdir()
    created = daemon.unary(f"{FS}/CreateWatcher", {"path": "polled"}).json()
    watcher = {"watcherId": created["watcherId"]}
    (root / "a").write_text("1")
    (root / "a").unlink()
    response = daemon.unary(f"{FS}/GetWatcherEvents", watcher).json()
    kinds = [e["type"] for e in response["events"]]
    assert kinds[0] == "EVENT_TYPE_CREATE" and "EVENT_TYPE_REMOVE" in kinds
    assert daemon.unary(f"{FS}/GetWatcherEvents", watcher).json() == {"events": []}
    assert daemon.unary(f"{FS}/RemoveWatcher", watcher).status_code == 200
    gone = daemon.unary(f"{FS}/GetWatcherEvents", watcher)
    assert gone.status_code == 404


def test_watching_a_missing_directory_is_not_found(daemon: Daemon) -> None:
    response = daemon.unary(f"{FS}/CreateWatcher", {"path": "no-such-dir"})
    assert response.json()["code"] == "not_found"


def test_watch_dir_survives_a_late_end_of_the_request_body(daemon: Daemon) -> None:
    # The host writes the envelope and the chunked body's terminator separately; a
    # terminator that arrives after the watch began is not the client hanging up.
    root = daemon.home / "late-end"
    root.mkdir()
    messages = daemon.stream(f"{FS}/WatchDir", {"path": "late-end"}, end_after=0.1)
    assert "start" in next(messages)
    (root / "f.txt").write_text("x")
    event = next(messages)
    assert event.get("filesystem") == {"name": "f.txt", "type": "EVENT_TYPE_CREATE"}
    messages.close()


def _raw_chunks(sock: socket.socket) -> Iterator[bytes]:
    """The de-chunked body of the one chunked answer read from ``sock``."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, buf = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), head
    while True:
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        line, _, buf = buf.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            return
        while len(buf) < size + 2:
            buf += sock.recv(65536)
        yield buf[:size]
        buf = buf[size + 2 :]


def test_a_pipelined_request_does_not_end_a_watch(daemon: Daemon) -> None:
    root = daemon.home / "pipelined"
    root.mkdir()
    payload = json.dumps({"path": "pipelined"}).encode()
    body = struct.pack(">BI", 0, len(payload)) + payload
    request = (
        f"POST /{FS}/WatchDir HTTP/1.1\r\nHost: sandbox\r\n"
        f"Content-Type: application/connect+json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(daemon.path)
        sock.settimeout(10)
        sock.sendall(request + body)
        messages = parse_frames(_raw_chunks(sock))
        assert "start" in next(messages)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: sandbox\r\n\r\n")  # while it watches
        (root / "f.txt").write_text("x")
        event = next(messages)
        assert event.get("filesystem") == {"name": "f.txt", "type": "EVENT_TYPE_CREATE"}
        threads = daemon.status("Threads")
    # Hanging up still ends the watch and its connection thread.
    wait_for(lambda: daemon.status("Threads") < threads)

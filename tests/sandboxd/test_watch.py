"""Directory watches, streamed and polled."""

from __future__ import annotations

import threading
from typing import Any

from .conftest import Daemon, wait_for

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

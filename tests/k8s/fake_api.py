"""A stand-in for the Kubernetes API, and only for it: the boundary the executor and the Pod
runtime cross through ``_client.Cluster`` (calls, watches, log streams). Everything on this
side of it (the runtime, the executor, the egress proxy, the policies) is the real code.

Objects live in a table; the test moves a Pod through its states (``set_pod``) as a kubelet
would, and every change is an event to the watches whose selectors match, first ADDED for
what exists, as the API server does. ``on_delete`` lets a test look at the world at the
moment a delete call arrives (e.g. whether the Pod's address was already released).
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ringfence.backends.kubernetes._client import translated

__all__ = ["FakeCluster"]

Obj = dict[str, Any]


class _Watch:
    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster
        self._events: queue.Queue[tuple[str, Obj] | None] = queue.Queue()
        self._stopped = False

    def stream(
        self,
        list_function: Callable[..., Any],
        namespace: str,
        *,
        timeout_seconds: int,
        field_selector: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,  # replays what exists either way
    ) -> Iterator[dict[str, Any]]:
        kind = "Pod" if list_function.__name__ == "list_namespaced_pod" else "Job"

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            if obj["kind"] != kind or meta["namespace"] != namespace:
                return False
            if field_selector and field_selector != f"metadata.name={meta['name']}":
                return False
            labels = meta.get("labels") or {}
            wanted = dict(p.split("=", 1) for p in (label_selector or "").split(",") if p)
            return wanted.items() <= labels.items()

        give_up = time.monotonic() + timeout_seconds
        self._cluster._subscribe(kind, self._events)
        try:
            while not self._stopped and time.monotonic() < give_up:
                try:
                    event = self._events.get(timeout=0.05)
                except queue.Empty:
                    continue
                if event is None:
                    return
                if matches(event[1]):
                    yield {"type": event[0], "object": copy.deepcopy(event[1])}
        finally:
            self._cluster._unsubscribe(self._events)

    def stop(self) -> None:
        self._stopped = True


class _LogStream:
    def stream(self, size: int) -> Iterator[bytes]:
        yield b"output\n"

    def release_conn(self) -> None:
        pass


class _Api:
    """CoreV1Api and BatchV1Api, as far as Ringfence calls them."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    def create_namespaced_pod(self, namespace: str, body: Obj) -> Obj:
        return self._cluster._create("Pod", namespace, body)

    def create_namespaced_job(self, namespace: str, body: Obj) -> Obj:
        job = self._cluster._create("Job", namespace, body)
        template = body["spec"]["template"]
        pod = {"metadata": {**template["metadata"], "name": body["metadata"]["name"] + "-pod"},
               "spec": template["spec"]}  # fmt: skip
        self._cluster._create("Pod", namespace, pod)
        return job

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self._cluster._delete("Pod", name)

    def delete_namespaced_job(self, name: str, namespace: str, **_: Any) -> None:
        """Foreground: its Pod goes at once; the Job lingers, being deleted, until a watch
        of Jobs next looks (then ADDED and DELETED), as it does while its Pods terminate."""
        self._cluster._delete("Pod", name + "-pod")
        self._cluster._delete("Job", name, foreground=True)

    def list_namespaced_pod(
        self, namespace: str, field_selector: str | None = None, **_: Any
    ) -> Obj:
        return self._cluster._list("Pod", field_selector)

    def list_namespaced_job(
        self, namespace: str, field_selector: str | None = None, **_: Any
    ) -> Obj:
        return self._cluster._list("Job", field_selector)

    def read_namespaced_pod_log(self, name: str, namespace: str, **_: Any) -> _LogStream:
        return _LogStream()


class FakeCluster:
    """Quacks like ``_client.Cluster`` for the executor and the Pod runtime."""

    def __init__(self) -> None:
        self.core = self.batch = _Api(self)
        self.threads = ThreadPoolExecutor(16, thread_name_prefix="fake-k8s")
        self.objects: dict[tuple[str, str], Obj] = {}
        self.deleted: list[tuple[str, str]] = []
        self.on_delete: Callable[[str, str], None] | None = None  # (kind, name), before it goes
        self._lock = threading.Lock()
        self._finalizing: set[tuple[str, str]] = set()
        self._watchers: list[queue.Queue[tuple[str, Obj] | None]] = []

    def watch_class(self) -> _Watch:
        return _Watch(self)

    def plain(self, obj: Any) -> Any:
        return obj

    async def call(self, doing: str, function: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        with translated(doing):
            return function(*args, **kw)

    def close(self) -> None:
        with self._lock:
            for events in self._watchers:
                events.put(None)
        self.threads.shutdown(wait=False, cancel_futures=True)

    # -- what a test does as the kubelet and the controllers would --------------------------

    def pod(self, name_prefix: str = "") -> Obj:
        """The one Pod whose name starts with ``name_prefix``."""
        (pod,) = [
            o for (k, n), o in self.objects.items() if k == "Pod" and n.startswith(name_prefix)
        ]
        return pod

    def set_pod(self, name: str, **status: Any) -> None:
        """Replace the Pod's status (``deletionTimestamp`` goes to its metadata)."""
        with self._lock:
            pod = self.objects[("Pod", name)]
            deleting = status.pop("deletionTimestamp", None)
            if deleting is not None:
                pod["metadata"]["deletionTimestamp"] = deleting
            pod["status"] = status
            self._publish("MODIFIED", pod)

    def set_job(self, name: str, **status: Any) -> None:
        with self._lock:
            job = self.objects[("Job", name)]
            job["status"] = status
            self._publish("MODIFIED", job)

    def remove(self, kind: str, name: str) -> None:
        """Someone else deleted it."""
        with self._lock:
            obj = self.objects.pop((kind, name))
            self._publish("DELETED", obj)

    # -- internals -------------------------------------------------------------------------

    def _create(self, kind: str, namespace: str, body: Obj) -> Obj:
        with self._lock:
            obj = copy.deepcopy(body)
            obj["kind"] = kind
            obj["metadata"]["namespace"] = namespace
            obj.setdefault("status", {"phase": "Pending"} if kind == "Pod" else {})
            key = (kind, obj["metadata"]["name"])
            if key in self.objects:
                raise RuntimeError(f"{key} exists")
            self.objects[key] = obj
            self._publish("ADDED", obj)
            return obj

    def _delete(self, kind: str, name: str, *, foreground: bool = False) -> None:
        if self.on_delete is not None:
            self.on_delete(kind, name)
        with self._lock:
            self.deleted.append((kind, name))
            if foreground and (kind, name) in self.objects:
                obj = self.objects[(kind, name)]
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                self._finalizing.add((kind, name))
                self._publish("MODIFIED", obj)
                return
            gone = self.objects.pop((kind, name), None)
            if gone is not None:
                self._publish("DELETED", gone)

    def _list(self, kind: str, field_selector: str | None = None) -> Obj:
        with self._lock:
            items = [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind]
        if field_selector:
            items = [o for o in items if field_selector == f"metadata.name={o['metadata']['name']}"]
        return {"items": items}

    def _publish(self, kind: str, obj: Obj) -> None:
        for events in self._watchers:
            events.put((kind, copy.deepcopy(obj)))

    def _subscribe(self, kind: str, events: queue.Queue[tuple[str, Obj] | None]) -> None:
        """What exists (ADDED), then every change: nothing in between is missed."""
        with self._lock:
            for key, obj in list(self.objects.items()):
                events.put(("ADDED", copy.deepcopy(obj)))
                if key[0] == kind and key in self._finalizing:
                    self._finalizing.discard(key)
                    del self.objects[key]
                    self._publish("DELETED", obj)
                    events.put(("DELETED", copy.deepcopy(obj)))
            self._watchers.append(events)

    def _unsubscribe(self, events: queue.Queue[tuple[str, Obj] | None]) -> None:
        with self._lock:
            if events in self._watchers:
                self._watchers.remove(events)

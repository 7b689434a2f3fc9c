"""The Kubernetes API stand-in (``tests/k8s/fake_api``) with a stand-in kubelet and Job
controller: a Job's Pod runs its container's command as a local process, so the real
``JobExecutor`` can be held to the executor contract without a cluster.

What the stand-in does, as the real ones would: a created Job's Pod starts at once (Running);
its output is its container log (followed while it runs); at its exit the Pod is Succeeded or
Failed with the container's exit code, and the Job gets its ``Complete`` or ``Failed``
condition; past the Job's ``activeDeadlineSeconds`` the process is killed and the Job fails
with ``DeadlineExceeded``; deleting the Pod kills it. The container's image, user, limits and
working directory are not applied (the command runs as the test, in a temporary directory):
what this proves is the executor's code, not a Pod's isolation.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from tests.k8s.fake_api import FakeCluster, _Api

__all__ = ["KubeletCluster"]

Obj = dict[str, Any]


class _Container:
    """One Pod's command, running; its output kept whole for the log."""

    def __init__(self, cluster: KubeletCluster, pod: str, job: str, spec: Obj, deadline: int):
        self._cluster = cluster
        self._pod = pod
        self._job = job
        self._output = bytearray()
        self._changed = threading.Condition()
        self._ended = False
        self._deleted = False
        self._workdir = tempfile.mkdtemp(prefix="rf-kubelet-")
        env = {"PATH": os.defpath, "HOME": self._workdir}
        env |= {item["name"]: item["value"] for item in spec.get("env", [])}
        self._process = subprocess.Popen(
            [*spec["command"], *spec.get("args", [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self._workdir,
            start_new_session=True,
        )
        self._deadline = time.monotonic() + deadline
        threading.Thread(target=self._run, name=f"kubelet-{pod}", daemon=True).start()

    def delete(self) -> None:
        self._deleted = True
        self._kill()

    def log(self, follow: bool) -> Iterator[bytes]:
        sent = 0
        while True:
            with self._changed:
                if follow:
                    self._changed.wait_for(lambda at=sent: len(self._output) > at or self._ended)
                chunk = bytes(self._output[sent:])
                ended = self._ended
            if chunk:
                sent += len(chunk)
                yield chunk
            elif ended or not follow:
                return

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)

    def _run(self) -> None:
        with contextlib.suppress(KeyError):  # deleted already
            self._cluster.set_pod(
                self._pod,
                phase="Running",
                podIP="127.0.0.1",
                containerStatuses=[{"name": "sandbox", "state": {"running": {}}}],
            )
        timer = threading.Timer(max(self._deadline - time.monotonic(), 0), self._kill)
        timer.start()
        assert self._process.stdout is not None
        while chunk := self._process.stdout.read1(64 * 1024):
            with self._changed:
                self._output += chunk
                self._changed.notify_all()
        code = self._process.wait()
        timer.cancel()
        shutil.rmtree(self._workdir, ignore_errors=True)
        with self._changed:
            self._ended = True
            self._changed.notify_all()
        if self._deleted:
            return
        if time.monotonic() >= self._deadline and code < 0:
            self._cluster.ended(self._pod, self._job, None, deadline=True)
        else:
            self._cluster.ended(self._pod, self._job, code, deadline=False)


class _KubeletApi(_Api):
    def __init__(self, cluster: KubeletCluster) -> None:
        super().__init__(cluster)
        self._kubelet = cluster

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> _Log:
        container = self._kubelet.containers.get(name)
        if container is None:
            return _Log(iter(()))
        return _Log(container.log(bool(kw.get("follow"))))


class _Log:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def stream(self, size: int) -> Iterator[bytes]:
        return self._chunks

    def release_conn(self) -> None:
        pass


class KubeletCluster(FakeCluster):
    """A ``FakeCluster`` whose Jobs' Pods run (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.core = self.batch = _KubeletApi(self)
        self.containers: dict[str, _Container] = {}

    def _create(self, kind: str, namespace: str, body: Obj) -> Obj:
        created = super()._create(kind, namespace, body)
        job = self.objects.get(("Job", created["metadata"]["name"].removesuffix("-pod")))
        if kind == "Pod" and job is not None:  # the stand-in names a Job's Pod so
            pod, (spec,) = created["metadata"]["name"], body["spec"]["containers"]
            deadline = job["spec"]["activeDeadlineSeconds"]
            self.containers[pod] = _Container(self, pod, job["metadata"]["name"], spec, deadline)
        return created

    def _delete(self, kind: str, name: str, *, foreground: bool = False) -> None:
        container = self.containers.get(name) if kind == "Pod" else None
        if container is not None:
            container.delete()
        super()._delete(kind, name, foreground=foreground)

    def ended(self, pod: str, job: str, code: int | None, *, deadline: bool) -> None:
        """The kubelet saw the container end, and the Job controller the Pod."""
        if deadline:
            pod_status: Obj = {"phase": "Failed", "reason": "DeadlineExceeded"}
            condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}
        else:
            terminated = {"name": "sandbox", "state": {"terminated": {"exitCode": code}}}
            pod_status = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [terminated],
            }
            condition = (
                {"type": "Complete", "status": "True"}
                if code == 0
                else {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
            )
        with contextlib.suppress(KeyError):  # deleted meanwhile
            self.set_pod(pod, **pod_status)
        with contextlib.suppress(KeyError):
            self.set_job(job, conditions=[condition])

    def close(self) -> None:
        for container in self.containers.values():
            container.delete()
        super().close()

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

A sandbox Pod (``PodSandboxRuntime``) runs too: its init container's copy of the daemon goes
to a temporary directory standing in for the Pod's volume, then its daemon starts listening
on the Pod's address, a loopback address of its own (``127.0.0.N``: one machine cannot give
each Pod a network namespace the host reaches, so the stand-in rewrites the boot's bind
address), and the Pod is Ready once it accepts connections, as its readiness probe would.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from ringfence.backends.kubernetes.manifests import DAEMON_MOUNT
from ringfence.testing.fakes.runtime import descendants
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


class _SandboxPod:
    """A sandbox Pod's daemon, running at its own loopback address."""

    def __init__(self, cluster: KubeletCluster, pod: str, spec: Obj, address: str) -> None:
        self._cluster = cluster
        self._pod = pod
        self._address = address
        self._deleted = False
        self._root = tempfile.mkdtemp(prefix="rf-kubelet-pod-")
        (copier,) = spec["initContainers"]
        (container,) = spec["containers"]
        self._port = container["ports"][0]["containerPort"]
        self._copier = self._local(copier["command"])
        self._command = self._local(container["command"])
        self._env = {"PATH": os.defpath, "HOME": self._root}
        self._env |= {item["name"]: item["value"] for item in container.get("env", [])}
        self._process: subprocess.Popen[bytes] | None = None
        threading.Thread(target=self._run, name=f"kubelet-{pod}", daemon=True).start()

    def _local(self, command: list[str]) -> list[str]:
        assert command[0] == "python3", command
        bind = "socket.create_server(('',"
        args = [a.replace(DAEMON_MOUNT, self._root) for a in command[1:]]
        args = [a.replace(bind, f"socket.create_server(({self._address!r},") for a in args]
        return [sys.executable, *args]

    def delete(self) -> None:
        self._deleted = True
        process = self._process
        if process is not None and process.returncode is None:
            for pid in descendants(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def _run(self) -> None:
        copy_env = {**self._env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        subprocess.run(self._copier, env=copy_env, check=True, timeout=60)
        if self._deleted:
            return
        self._process = subprocess.Popen(
            self._command, env=self._env, cwd=self._root, start_new_session=True
        )
        give_up = time.monotonic() + 30
        while self._process.poll() is None and time.monotonic() < give_up:
            try:
                socket.create_connection((self._address, self._port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.01)
        if self._process.poll() is None and not self._deleted:
            with contextlib.suppress(KeyError):
                self._cluster.set_pod(
                    self._pod, phase="Running", podIP=self._address,
                    conditions=[{"type": "Ready", "status": "True"}],
                    containerStatuses=[{"name": "sandbox", "state": {"running": {}}}],
                )  # fmt: skip
        code = self._process.wait()
        shutil.rmtree(self._root, ignore_errors=True)
        if not self._deleted:
            terminated = {"name": "sandbox", "state": {"terminated": {"exitCode": code}}}
            with contextlib.suppress(KeyError):
                self._cluster.set_pod(self._pod, phase="Failed", containerStatuses=[terminated])


class _KubeletApi(_Api):
    def __init__(self, cluster: KubeletCluster) -> None:
        super().__init__(cluster)
        self._kubelet = cluster

    def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> _Log:
        container = self._kubelet.containers.get(name)
        if not isinstance(container, _Container):
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
        self.containers: dict[str, _Container | _SandboxPod] = {}
        self._addresses = (f"127.0.{n // 250}.{n % 250 + 2}" for n in itertools.count())

    def _create(self, kind: str, namespace: str, body: Obj) -> Obj:
        created = super()._create(kind, namespace, body)
        job = self.objects.get(("Job", created["metadata"]["name"].removesuffix("-pod")))
        if kind == "Pod" and job is not None:  # the stand-in names a Job's Pod so
            pod, (spec,) = created["metadata"]["name"], body["spec"]["containers"]
            deadline = job["spec"]["activeDeadlineSeconds"]
            self.containers[pod] = _Container(self, pod, job["metadata"]["name"], spec, deadline)
        elif kind == "Pod" and "initContainers" in body["spec"]:  # an interactive sandbox
            pod = created["metadata"]["name"]
            self.containers[pod] = _SandboxPod(self, pod, body["spec"], next(self._addresses))
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

"""Interactive sandboxes on Kubernetes: one Pod per sandbox, running the sandbox daemon.

The Pod (``manifests.pod_manifest``) has the isolation of a Job's and serves the daemon on
the daemon port. The control plane reaches it at the Pod's IP, directly: the sandbox
NetworkPolicy admits, on that port, only the control plane's Pods. (The API server's
port-forward would put the API server and the kubelet on the path of every command and
file, and needs ``pods/portforward``, which reaches any port of any Pod in the namespace.)
A relay (``_relay``) gives the daemon client the unix socket it expects.

The sandbox's timeout is kept here, not in the Pod: a Pod's ``activeDeadlineSeconds`` may
be shortened but never extended, so ``set_timeout`` could not follow it. The Pod's own
deadline is ``max_timeout``, a backstop for a control plane that dies without cleaning up.

With egress rules (and this replica's egress, ``replica_egress``), the Pod's address is
admitted to the proxy once the Pod is ready, before ``start`` returns (nothing of the
sandbox's own runs before), and released before every delete and at the first watch event
that shows the Pod deleted or ended by someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from ringfence.backends._interactive import LaunchSpec, Stateless, Unmeasured
from ringfence.backends.kubernetes._client import Cluster
from ringfence.backends.kubernetes._relay import Relay
from ringfence.backends.kubernetes._watch import watch
from ringfence.backends.kubernetes.manifests import pod_manifest
from ringfence.backends.kubernetes.replica_egress import ReplicaEgress, has_rules
from ringfence.backends.kubernetes.status import PodPhase, pod_view
from ringfence.config import Config
from ringfence.errors import ExecutionNotFound, RingfenceError, SandboxError, StateUnsupported
from ringfence.models import ExecutionResult, Status

__all__ = ["PodSandbox", "PodSandboxRuntime", "pod_ready"]

log = logging.getLogger(__name__)

_READY_SECONDS = 120  # image pull and scheduling included
_GONE_SECONDS = 60
PodEvents = AsyncGenerator[tuple[str, dict[str, Any]], None]  # a watch of one Pod
_WATCH_SECONDS = 300  # each watch of a running sandbox; then it is listed and watched again


def pod_ready(pod: dict[str, Any]) -> bool:
    """Whether the Pod's daemon accepts connections (its readiness probe passed)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and bool((pod.get("status") or {}).get("podIP"))


class PodSandbox(Unmeasured, Stateless):
    """A running sandbox Pod: where the control plane reaches its daemon, and its end."""

    reason = "the kubernetes backend does not capture sandbox state yet (docs/kubernetes.md)"
    unmeasured = (
        "the kubernetes backend does not read pod metrics yet (the cluster's metrics API, "
        "metrics.k8s.io, is not queried; see docs/kubernetes.md)"
    )

    def __init__(
        self,
        runtime: PodSandboxRuntime,
        name: str,
        relay: Relay,
        timeout: float,
        events: PodEvents,
    ) -> None:
        """``events``: the watch that saw the Pod ready, read on from there (a new watch
        would miss a deletion made before it began)."""
        self._runtime = runtime
        self._name = name
        self._relay = relay
        self._cause: Status | None = None  # what ended it, when we did
        self._deadline: asyncio.TimerHandle | None = None
        self._end: asyncio.Task[ExecutionResult] = asyncio.create_task(self._watch(events))
        self._schedule(timeout)

    @property
    def socket_path(self) -> Path:
        return self._relay.path

    @property
    def running(self) -> bool:
        return not self._end.done()

    async def set_timeout(self, seconds: float) -> None:
        if not self.running:
            raise ExecutionNotFound(f"sandbox pod {self._name} has ended")
        self._schedule(seconds)

    async def kill(self) -> ExecutionResult:
        await self._stop(Status.CANCELLED)
        return await self.ended()

    async def ended(self) -> ExecutionResult:
        return await asyncio.shield(self._end)

    def _schedule(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(
            seconds, lambda: loop.create_task(self._stop(Status.TIMED_OUT))
        )

    async def _stop(self, cause: Status) -> None:
        if self._cause is None and self.running:
            self._cause = cause
        await self._runtime.delete(self._name)

    async def _watch(self, events: PodEvents) -> ExecutionResult:
        """Wait until the Pod is gone, whoever ended it; then release the relay.

        ``events`` is read to its end, then the Pod is watched again from a listing of it
        (``PodSandboxRuntime.watch_existing``): gone by then is gone, not waited for."""
        error: str | None = None
        watching: PodEvents | None = events
        try:
            while watching is not None:
                try:
                    async for kind, pod in watching:
                        view = pod_view(pod)
                        deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
                        if kind == "DELETED" or deleting:
                            await self._runtime.release(self._name)
                        if kind == "DELETED":
                            return self._result(error)
                        if view.phase in (PodPhase.ENDED, PodPhase.BROKEN) and self._cause is None:
                            error = view.error or f"the sandbox daemon exited ({view.exit_code})"
                            await self._runtime.delete(self._name)
                finally:
                    await _closed(watching)
                watching = await self._runtime.watch_existing(self._name, _WATCH_SECONDS)
            await self._runtime.release(self._name)
            return self._result(error)
        except RingfenceError as exc:  # the API failed: the Pod must not outlive us
            log.warning("lost the watch of sandbox pod %s: %s", self._name, exc.message)
            with contextlib.suppress(RingfenceError):
                await self._runtime.delete(self._name)
            return self._result(error or f"lost track of the sandbox pod: {exc.message}")
        finally:
            if self._deadline is not None:
                self._deadline.cancel()
            await asyncio.shield(self._runtime.release(self._name))
            await self._relay.aclose()

    def _result(self, error: str | None) -> ExecutionResult:
        status = self._cause or Status.FAILED
        if status is Status.FAILED and error is None:
            error = "the sandbox pod was deleted by someone else"
        return ExecutionResult(
            execution_id=self._name,
            status=status,
            job_name=self._name,
            backend="job",
            error=error if status is Status.FAILED else None,
        )


class PodSandboxRuntime:
    """Starts sandbox Pods in the sandbox namespace."""

    def __init__(self, config: Config, cluster: Cluster) -> None:
        """Raises ``OSError`` when the relay directory cannot be prepared."""
        self._config = config
        self._cluster = cluster
        self._namespace = config.namespace
        relays = config.runtime_dir / "pod-relays"
        relays.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._relays = relays / f"i{os.getpid()}"
        self._relays.mkdir(mode=0o700, exist_ok=True)
        self._sandboxes: set[PodSandbox] = set()
        self._egress: ReplicaEgress | None = None
        self._admitted: dict[str, str] = {}  # Pod name -> its address, admitted to the proxy

    def use_egress(self, egress: ReplicaEgress) -> None:
        """Enforce egress rules with this replica's proxy (without it they are refused)."""
        self._egress = egress

    async def start(self, spec: LaunchSpec) -> PodSandbox:
        """Create the Pod; return once its daemon is ready (and, with egress rules, its
        address admitted to this replica's proxy).

        Raises:
            SandboxError: it could not be created or never became ready (the message says why).
            InvalidRequest: the image is a host directory; egress rules and no proxy here.
            StateUnsupported: ``spec.volumes`` given (Pods mount no volumes yet), or
                ``spec.project`` (a Pod has no host directory to show).
        """
        if spec.volumes:
            raise StateUnsupported(
                "volumes: sandbox Pods cannot mount volumes yet (they live on the server's "
                "disk); use the local backend"
            )
        if spec.project is not None:  # the service refuses it first; never ignored here
            raise StateUnsupported(
                "project: sandbox Pods have no project views (a host directory of the "
                "server's is not on the Pod's node); use the local backend"
            )
        sandbox_id = uuid.uuid4().hex
        egress = self._egress
        manifest = pod_manifest(
            sandbox_id, spec.image, spec.env, spec.limits, self._config, network=spec.network,
            egress_proxy=egress.at if egress is not None else None,
        )  # fmt: skip
        name = manifest["metadata"]["name"]
        await self._cluster.call(
            f"creating sandbox pod {name}",
            self._cluster.core.create_namespaced_pod, self._namespace, manifest,
        )  # fmt: skip
        events = self.watch_pod(name, _READY_SECONDS)  # read on by the sandbox once ready
        try:
            address = await self._ready(name, events)
            if egress is not None and spec.network is not None and has_rules(spec.network):
                egress.admit(address, spec.network, f"sandbox:{sandbox_id}")
                self._admitted[name] = address
            relay = Relay(self._relays / f"{sandbox_id}.sock", address,
                          self._config.kubernetes_daemon_port)  # fmt: skip
            await relay.start()
        except BaseException:
            await asyncio.shield(_closed(events))
            await asyncio.shield(self.delete(name))
            raise
        sandbox = PodSandbox(self, name, relay, spec.timeout, events)
        self._sandboxes.add(sandbox)
        sandbox._end.add_done_callback(lambda _: self._sandboxes.discard(sandbox))
        return sandbox

    async def aclose(self) -> None:
        sandboxes = list(self._sandboxes)
        await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)
        shutil.rmtree(self._relays, ignore_errors=True)
        self._cluster.close()

    async def release(self, name: str) -> None:
        """Release the Pod's address from the proxy, cutting its connections; idempotent."""
        address = self._admitted.pop(name, None)
        if address is not None and self._egress is not None:
            await self._egress.release(address)

    async def delete(self, name: str) -> None:
        """Release the Pod's address, then delete the Pod at once (no grace); gone already
        is fine.

        Raises:
            SandboxError: the API failed.
        """
        await self.release(name)
        with contextlib.suppress(ExecutionNotFound):
            await self._cluster.call(
                f"deleting sandbox pod {name}", self._cluster.core.delete_namespaced_pod,
                name, self._namespace, grace_period_seconds=0,
            )  # fmt: skip

    def watch_pod(self, name: str, seconds: int, **since: Any) -> PodEvents:
        return watch(
            self._cluster, f"watching sandbox pod {name}",
            self._cluster.core.list_namespaced_pod, self._namespace,
            field_selector=f"metadata.name={name}", timeout_seconds=seconds, **since,
        )  # fmt: skip

    async def watch_existing(self, name: str, seconds: int) -> PodEvents | None:
        """A watch of the Pod from a listing of it, or None if it is gone. A watch sends
        nothing about a Pod already gone, so it is listed first and watched from that
        listing's version: no deletion is missed.

        Raises:
            SandboxError: the API failed.
        """
        selector = f"metadata.name={name}"
        listed = self._cluster.plain(
            await self._cluster.call(
                f"looking for sandbox pod {name}", self._cluster.core.list_namespaced_pod,
                self._namespace, field_selector=selector,
            )
        )  # fmt: skip
        if not listed.get("items"):
            return None
        version = (listed.get("metadata") or {}).get("resourceVersion")
        return self.watch_pod(name, seconds, **({"resource_version": version} if version else {}))

    async def _ready(self, name: str, events: PodEvents) -> str:
        """The Pod's IP once its daemon is ready (``events`` is left open, to be read on)."""
        async for kind, pod in events:
            view = pod_view(pod)
            if kind == "DELETED":
                raise SandboxError(f"sandbox pod {name} was deleted while starting")
            if view.phase is PodPhase.BROKEN:
                raise SandboxError(view.error or "the sandbox pod cannot start")
            if view.phase is PodPhase.ENDED:
                raise SandboxError(f"the sandbox daemon exited ({view.exit_code}) at start")
            if pod_ready(pod):
                return str(pod["status"]["podIP"])
        raise SandboxError(f"the sandbox pod was not ready within {_READY_SECONDS} s")


async def _closed(events: AsyncGenerator[Any, None]) -> None:
    """Close a watch (``_watch.watch``): its thread stops at its next event."""
    await events.aclose()

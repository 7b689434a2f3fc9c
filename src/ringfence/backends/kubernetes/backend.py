"""The ``job`` backend's executor: each execution is one Kubernetes Job.

``execute`` creates the Job (``manifests.job_manifest``), follows its Pod with a watch (not
a poll), streams the output into a bounded log while it runs (a Pod killed at its deadline
takes its log with it), then waits, with a watch on the Job, for the condition that ends it.
Cancel deletes the Job with foreground propagation: the Job is gone only once its Pods are.
``get_status`` answers from this process's table, else finds the Job by its labels (an
execution started by another replica, or before a restart).

With egress rules (and this replica's egress, ``replica_egress``), the Pod's address is
admitted to the proxy at the first watch event that shows it, while the Pod's gate holds
its command, and released before any delete and once the Pod ends or goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ringfence.backends._output import BoundedLog
from ringfence.backends._protocol import OutputCallback, StartCallback
from ringfence.backends._runs import Run, RunTable
from ringfence.backends.kubernetes._client import Cluster
from ringfence.backends.kubernetes._watch import stream_log, watch
from ringfence.backends.kubernetes.egress import EgressProxy
from ringfence.backends.kubernetes.egress_proxy import PodEgressProxy
from ringfence.backends.kubernetes.manifests import (
    DOMAIN,
    EXECUTION_LABEL,
    ROLE_LABEL,
    job_manifest,
    label_value,
)
from ringfence.backends.kubernetes.replica_egress import ReplicaEgress, has_rules
from ringfence.backends.kubernetes.status import (
    CONTAINER,
    Outcome,
    PodPhase,
    PodView,
    job_outcome,
    pod_view,
)
from ringfence.config import Config
from ringfence.errors import (
    DuplicateExecution,
    ExecutionNotFound,
    InvalidRequest,
    RingfenceError,
    SandboxError,
)
from ringfence.models import ExecutionRequest, ExecutionResult, NetworkPolicy, Status

__all__ = ["JobExecutor", "execution_selector", "result_from_cluster"]

log = logging.getLogger(__name__)

_WATCH_SLICE_SECONDS = 300  # each watch is re-opened at most this often
_START_SLACK_SECONDS = 120  # pull and schedule time beyond the deadline, at most
_END_SECONDS = 120  # from the Pod's end (or a delete) to the Job's terminal state
_LOG_DRAIN_SECONDS = 10.0


def execution_selector(execution_id: str) -> str:
    """The label selector of an execution's Job and Pod."""
    return f"{ROLE_LABEL}=execution,{EXECUTION_LABEL}={label_value(execution_id)}"


class JobExecutor:
    """Runs each request as a Job in the sandbox namespace (see ``manifests``)."""

    name = "job"

    def __init__(self, config: Config, cluster: Cluster | None = None) -> None:
        """Raises ``BackendUnavailable`` without the client library or a cluster."""
        self.config = config
        self.cluster = cluster or Cluster()
        self._runs = RunTable(
            ttl=config.ttl_seconds_after_finished, max_finished=config.max_retained_results
        )
        self._egress: ReplicaEgress | None = None
        # Where the sandbox service finds a running sandbox's session (``set_network``).
        self.egress: PodEgressProxy | None = None

    def use_egress(self, egress: ReplicaEgress) -> None:
        """Enforce egress rules with this replica's proxy (without it they are refused)."""
        self._egress, self.egress = egress, egress.proxy

    def check(self, request: ExecutionRequest) -> None:
        job_manifest(request, self.config, self._egress_at)

    @property
    def _egress_at(self) -> EgressProxy | None:
        return self._egress.at if self._egress is not None else None

    async def execute(
        self,
        request: ExecutionRequest,
        *,
        on_output: OutputCallback | None = None,
        on_start: StartCallback | None = None,
    ) -> ExecutionResult:
        manifest = job_manifest(request, self.config, self._egress_at)
        name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        with contextlib.suppress(ExecutionNotFound):
            self._runs.get(request.id)
            raise DuplicateExecution(f"an execution with id {request.id!r} already exists")
        run = Run(
            id=request.id,
            log=BoundedLog(self.config.max_log_bytes),
            backend=self.name,
            job_name=name,
        )
        try:
            await self.cluster.call(
                f"creating Job {name}", self.cluster.batch.create_namespaced_job, namespace,
                manifest,
            )  # fmt: skip
        except (DuplicateExecution, InvalidRequest):
            raise
        except RingfenceError as exc:
            self._runs.add(run)
            self._end(run, Outcome(Status.FAILED, error=exc.message))
            return run.result()
        self._runs.add(run)
        try:
            outcome = await _Supervision(
                self, run, namespace, manifest["spec"]["activeDeadlineSeconds"], on_output,
                on_start, request.network if has_rules(request.network) else None,
            ).run()  # fmt: skip
        except BaseException:
            # Cancelled (or a bug): nothing of the sandbox may remain.
            await asyncio.shield(self._delete(namespace, name))
            self._end(run, Outcome(Status.CANCELLED, error="the caller stopped waiting"))
            raise
        self._end(run, outcome)
        return run.result()

    async def get_status(self, execution_id: str) -> ExecutionResult:
        with contextlib.suppress(ExecutionNotFound):
            return self._runs.get(execution_id).result()
        job, pod = await self._find(execution_id)
        logs = BoundedLog(self.config.max_log_bytes)
        if pod is not None and pod_view(pod).phase in (PodPhase.RUNNING, PodPhase.ENDED):
            with contextlib.suppress(RingfenceError):  # a log gone with its Pod is no error
                await stream_log(
                    self.cluster, job["metadata"]["namespace"], pod["metadata"]["name"],
                    CONTAINER, logs.write, follow=False,
                )  # fmt: skip
        return result_from_cluster(execution_id, job, pod, logs)

    async def cancel(self, execution_id: str) -> ExecutionResult:
        try:
            run = self._runs.get(execution_id)
        except ExecutionNotFound:
            result = await self.get_status(execution_id)  # another replica's, or earlier
            if result.status.is_terminal:
                return result
            job, _ = await self._find(execution_id)
            await self._delete(job["metadata"]["namespace"], job["metadata"]["name"])
            return result.model_copy(update={"status": Status.CANCELLED, "exit_code": None})
        if not run.status.is_terminal:
            run.cancel_requested.set()
            await run.done.wait()
        return run.result()

    async def aclose(self) -> None:
        running = self._runs.running()
        for run in running:
            run.cancel_requested.set()
        await asyncio.gather(*(run.done.wait() for run in running))
        if self._egress is not None:
            await self._egress.proxy.aclose()
        # The cluster stays open: the sandbox runtime shares it and closes after us.

    async def _find(self, execution_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The execution's Job and its Pod (None before it exists or once it is gone)."""
        selector = execution_selector(execution_id)
        namespace = self.config.namespace
        jobs = await self.cluster.call(
            f"finding execution {execution_id}",
            self.cluster.batch.list_namespaced_job, namespace, label_selector=selector,
        )  # fmt: skip
        matching = [
            job
            for job in self.cluster.plain(jobs)["items"]
            if job["metadata"].get("annotations", {}).get(f"{DOMAIN}/execution-id")
            == execution_id  # the label may be a digest: the annotation is the id itself
        ]
        if not matching:
            raise ExecutionNotFound(f"no execution with id {execution_id!r}")
        pods = await self.cluster.call(
            f"finding the pod of execution {execution_id}",
            self.cluster.core.list_namespaced_pod, namespace, label_selector=selector,
        )  # fmt: skip
        items = self.cluster.plain(pods)["items"]
        return matching[0], (items[0] if items else None)

    async def _delete(self, namespace: str, name: str) -> None:
        """Delete the Job and, before it, its Pods (foreground); gone already is fine."""
        with contextlib.suppress(ExecutionNotFound):
            await self.cluster.call(
                f"deleting Job {name}", self.cluster.batch.delete_namespaced_job, name,
                namespace, propagation_policy="Foreground", grace_period_seconds=0,
            )  # fmt: skip

    def _end(self, run: Run, outcome: Outcome) -> None:
        status = outcome.status
        if run.status is Status.PENDING and status in (Status.SUCCEEDED, Status.TIMED_OUT):
            run.move_to(Status.RUNNING)  # it ran, even if no watch event showed it running
        run.move_to(status)
        run.exit_code, run.error = outcome.exit_code, outcome.error
        self._runs.finished(run)
        run.done.set()


class _NotAdmitted(Exception):
    """The proxy would not take the Pod's address (still another sandbox's)."""


class _Supervision:
    """Follows one execution from its created Job to its end."""

    def __init__(
        self,
        executor: JobExecutor,
        run: Run,
        namespace: str,
        deadline: int,
        on_output: OutputCallback | None,
        on_start: StartCallback | None,
        network: NetworkPolicy | None = None,
    ) -> None:
        """``network``: a policy with rules, whose Pod this replica's proxy admits."""
        self._executor = executor
        self._deadline = deadline
        self._cluster = executor.cluster
        self._run = run
        self._namespace = namespace
        self._name = run.job_name or ""
        self._on_output = on_output
        self._on_start = on_start
        self._logs: asyncio.Task[None] | None = None
        self._network = network
        self._admitted: str | None = None  # the Pod address admitted to the proxy

    async def run(self) -> Outcome:
        cancel = asyncio.ensure_future(self._run.cancel_requested.wait())
        follow = asyncio.ensure_future(self._follow())
        try:
            await asyncio.wait({cancel, follow}, return_when=asyncio.FIRST_COMPLETED)
            try:
                if cancel.done():
                    follow.cancel()
                    await self._delete()
                    await self._job_gone()
                    outcome = Outcome(Status.CANCELLED)
                else:
                    outcome = follow.result()
            except _NotAdmitted as exc:  # its gate never opened: its command never ran
                with contextlib.suppress(RingfenceError):
                    await self._delete()
                outcome = Outcome(Status.FAILED, error=str(exc))
            except RingfenceError as exc:  # the API failed midway: report it, leave nothing
                with contextlib.suppress(RingfenceError):
                    await self._delete()
                outcome = Outcome(Status.FAILED, error=f"lost track of the Job: {exc.message}")
        finally:
            cancel.cancel()
            follow.cancel()
            await asyncio.shield(self._release())
        if self._logs is not None:
            with contextlib.suppress(TimeoutError, RingfenceError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._logs), _LOG_DRAIN_SECONDS)
            self._logs.cancel()
        return outcome

    async def _follow(self) -> Outcome:
        pod = await self._pod_until_it_ends()
        await self._release()  # its command has ended (or never will run)
        if pod is not None and pod.phase is PodPhase.BROKEN:
            await self._delete()
            return Outcome(Status.FAILED, error=pod.error)
        return await self._job_end(pod)

    async def _pod_until_it_ends(self) -> PodView | None:
        """The Pod's last state: ended, broken, or None (gone, or never there in time)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._deadline + _START_SLACK_SECONDS
        last: PodView | None = None
        while (left := give_up - loop.time()) > 0:
            async for kind, pod in watch(
                self._cluster, f"watching the pod of Job {self._name}",
                self._cluster.core.list_namespaced_pod, self._namespace,
                label_selector=execution_selector(self._run.id),
                timeout_seconds=int(min(left, _WATCH_SLICE_SECONDS)) + 1,
            ):  # fmt: skip
                if kind == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp"):
                    await self._release()
                if kind == "DELETED":
                    return last if last is not None and last.phase is PodPhase.ENDED else None
                last = pod_view(pod)
                self._admit(pod, last)
                if last.phase in (PodPhase.RUNNING, PodPhase.ENDED):
                    self._started(pod["metadata"]["name"])
                if last.phase in (PodPhase.ENDED, PodPhase.BROKEN):
                    return last
        return last

    async def _job_end(self, pod: PodView | None) -> Outcome:
        async for kind, job in watch(
            self._cluster, f"watching Job {self._name}",
            self._cluster.batch.list_namespaced_job, self._namespace,
            field_selector=f"metadata.name={self._name}", timeout_seconds=_END_SECONDS,
        ):  # fmt: skip
            if kind == "DELETED":
                return Outcome(Status.FAILED, error="the Job was deleted by someone else")
            outcome = job_outcome(job, pod)
            if outcome is not None:
                return outcome
        await self._delete()
        return Outcome(Status.FAILED, error="the Job did not report its end in time; deleted")

    async def _job_gone(self) -> None:
        """Until the Job is deleted. A watch sends nothing about a Job already gone, so the
        Job is listed first, and watched from that list's version: no deletion is missed."""
        selector = f"metadata.name={self._name}"
        listed = self._cluster.plain(
            await self._cluster.call(
                f"looking for Job {self._name}", self._cluster.batch.list_namespaced_job,
                self._namespace, field_selector=selector,
            )
        )  # fmt: skip
        if not listed.get("items"):
            return
        version = (listed.get("metadata") or {}).get("resourceVersion")
        since = {"resource_version": version} if version else {}
        async for kind, _ in watch(
            self._cluster, f"waiting for Job {self._name} to be deleted",
            self._cluster.batch.list_namespaced_job, self._namespace,
            field_selector=selector, timeout_seconds=_END_SECONDS, **since,
        ):  # fmt: skip
            if kind == "DELETED":
                return

    def _admit(self, pod: dict[str, Any], view: PodView) -> None:
        """Admit the Pod's address to the proxy once it has one (its gate waits for this).

        Raises:
            _NotAdmitted: the address is still another sandbox's.
        """
        egress, network = self._executor._egress, self._network
        if egress is None or network is None or self._admitted is not None:
            return
        address = (pod.get("status") or {}).get("podIP")
        deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
        if not address or deleting or view.phase in (PodPhase.ENDED, PodPhase.BROKEN):
            return
        try:
            egress.admit(address, network, f"execution:{self._run.id}")
        except SandboxError as exc:
            raise _NotAdmitted(exc.message) from exc
        self._admitted = address

    async def _release(self) -> None:
        """Release the Pod's address (before any delete: the address outlives no Pod)."""
        egress, address = self._executor._egress, self._admitted
        if egress is not None and address is not None:
            self._admitted = None
            await egress.release(address)

    async def _delete(self) -> None:
        await self._release()
        await self._executor._delete(self._namespace, self._name)

    def _started(self, pod_name: str) -> None:
        if self._logs is not None:
            return
        self._run.move_to(Status.RUNNING)
        if self._on_start is not None:
            try:
                self._on_start(self._run.result())
            except Exception:  # boundary: a caller's callback
                log.exception("an on_start callback failed")
        self._logs = asyncio.ensure_future(
            stream_log(
                self._cluster, self._namespace, pod_name, CONTAINER, self._output, follow=True
            )
        )

    def _output(self, chunk: bytes) -> None:
        self._run.log.write(chunk)
        if self._on_output is not None:
            try:
                self._on_output(chunk)
            except Exception:  # boundary: a caller's callback; never called again
                log.exception("an on_output callback failed; it will not be called again")
                self._on_output = None


def result_from_cluster(
    execution_id: str, job: dict[str, Any], pod: dict[str, Any] | None, logs: BoundedLog
) -> ExecutionResult:
    """An execution's result as read from the cluster (for ``get_status`` and ``cancel``)."""
    view = pod_view(pod) if pod is not None else None
    outcome = job_outcome(job, view)
    status_field = job.get("status") or {}
    if outcome is None:
        running = view is not None and view.phase in (PodPhase.RUNNING, PodPhase.ENDED)
        outcome = Outcome(Status.RUNNING if running else Status.PENDING)
    return ExecutionResult(
        execution_id=execution_id,
        status=outcome.status,
        exit_code=outcome.exit_code,
        logs=logs.text(),
        logs_truncated=logs.truncated,
        job_name=job["metadata"]["name"],
        backend=JobExecutor.name,
        started_at=status_field.get("startTime"),
        finished_at=status_field.get("completionTime"),
        error=outcome.error,
    )

"""The Job executor against a real API server: run only when KUBECONFIG names a cluster.

No Kubernetes cluster can run on the machines these tests are developed on (no nested
containers with a kubelet), so this module is the one group of tests CI may skip. Against
a cluster, apply ``ringfence k8s render`` first (the namespace, accounts and policy).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest

from ringfence.backends.kubernetes.backend import JobExecutor
from ringfence.backends.kubernetes.manifests import job_manifest
from ringfence.config import Config
from ringfence.errors import DuplicateExecution, ExecutionNotFound
from ringfence.models import ExecutionRequest, Status

from .conftest import assert_valid

pytestmark = pytest.mark.skipif(
    not os.environ.get("KUBECONFIG"),
    reason="no Kubernetes cluster can run on these machines: set KUBECONFIG to a real "
    "cluster (with ringfence k8s render applied) to run the job backend's end-to-end tests",
)


@pytest.fixture
async def executor() -> AsyncIterator[JobExecutor]:
    job = JobExecutor(Config(backend="job", max_log_bytes=4096, ttl_seconds_after_finished=60))
    yield job
    await job.aclose()


def _request(script: str, timeout: float = 120) -> ExecutionRequest:
    request = ExecutionRequest(
        id=f"e2e-{uuid.uuid4().hex[:12]}", command=["sh", "-c", script], timeout=timeout,
        session_id="s-1", checkpoint_id="cp-1", approved_by="alice",
    )  # fmt: skip
    assert_valid(job_manifest(request, Config(backend="job")))
    return request


async def test_success_with_its_output(executor: JobExecutor) -> None:
    output: list[bytes] = []
    result = await executor.execute(_request("echo hello; id -u"), on_output=output.append)
    assert result.status is Status.SUCCEEDED and result.exit_code == 0
    assert "hello" in result.logs and "65532" in result.logs
    assert b"hello" in b"".join(output)


async def test_failure_with_its_exit_code(executor: JobExecutor) -> None:
    result = await executor.execute(_request("echo broken >&2; exit 3"))
    assert result.status is Status.FAILED and result.exit_code == 3
    assert "broken" in result.logs


async def test_the_root_filesystem_is_read_only(executor: JobExecutor) -> None:
    result = await executor.execute(_request("touch /etc/x || exit 9; exit 0"))
    assert result.exit_code == 9
    writable = await executor.execute(_request("echo ok > /workspace/f && cat /workspace/f"))
    assert writable.status is Status.SUCCEEDED and "ok" in writable.logs


async def test_deadline_is_timed_out(executor: JobExecutor) -> None:
    result = await executor.execute(_request("sleep 600", timeout=5))
    assert result.status is Status.TIMED_OUT and result.exit_code is None


async def test_cancel_deletes_the_job(executor: JobExecutor) -> None:
    request = _request("echo started; sleep 600")
    started = asyncio.Event()
    running = asyncio.create_task(executor.execute(request, on_start=lambda _: started.set()))
    await asyncio.wait_for(started.wait(), 120)
    cancelled = await executor.cancel(request.id)
    assert cancelled.status is Status.CANCELLED
    assert (await running).status is Status.CANCELLED
    other = JobExecutor(Config(backend="job"))
    try:
        with pytest.raises(ExecutionNotFound):  # foreground: the Job went after its Pods
            await other.get_status(request.id)
    finally:
        await other.aclose()


async def test_logs_are_bounded(executor: JobExecutor) -> None:
    result = await executor.execute(_request("head -c 200000 /dev/zero | tr '\\0' x; echo END"))
    assert result.status is Status.SUCCEEDED and result.logs_truncated
    assert len(result.logs.encode()) < 4096 + 100 and result.logs.rstrip().endswith("END")


async def test_status_is_found_by_label_from_another_replica(executor: JobExecutor) -> None:
    request = _request("echo found")
    result = await executor.execute(request)
    other = JobExecutor(Config(backend="job"))
    try:
        seen = await other.get_status(request.id)
    finally:
        await other.aclose()
    assert (seen.status, seen.job_name) == (Status.SUCCEEDED, result.job_name)
    assert "found" in seen.logs
    with pytest.raises(DuplicateExecution):
        await executor.execute(request)


async def test_an_image_that_cannot_be_pulled_fails_clearly(executor: JobExecutor) -> None:
    request = _request("true").model_copy(
        update={"image": "registry.invalid/ringfence/none:0", "id": f"e2e-{uuid.uuid4().hex[:12]}"}
    )
    result = await executor.execute(request)
    assert result.status is Status.FAILED and "image" in (result.error or "")

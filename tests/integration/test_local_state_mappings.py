"""A real sandbox's process writes through a long-lived ``MAP_SHARED`` mapping between
checkpoints (review 16a, I2): on tmpfs such writes move no ctime, so only the mappings the
store reads from the frozen cgroup's processes tell the checkpoint and the rollback that the
file changed (SQLite's WAL index, LMDB)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from ringfence.backends._interactive import LaunchSpec
from ringfence.backends.local import LocalExecutor
from ringfence.backends.local.interactive import LocalSandboxRuntime
from ringfence.backends.local.probe import Host
from ringfence.backends.local.sandbox import LocalSandbox
from ringfence.config import Config
from ringfence.models import ResourceLimits
from ringfence.testing.backend_checks import run_in_sandbox

pytestmark = pytest.mark.integration
_COARSE = 5  # CLOCK_REALTIME_COARSE, the clock file times come from

MAPPER = r"""
import mmap, os
fd = os.open("/home/user/db", os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
os.mkfifo("/tmp/cmd"); os.mkfifo("/tmp/ack")
while True:
    with open("/tmp/cmd") as cmd:
        word = cmd.read().strip().encode()
    m[0:4] = word
    with open("/tmp/ack", "w") as ack:
        ack.write("ok")
"""


@pytest.fixture
async def runtime(local_host: Host) -> AsyncIterator[LocalSandboxRuntime]:
    if not local_host.volumes:
        pytest.skip(f"no volumes on this host: {'; '.join(local_host.state_missing)}")
    config = Config()
    built = LocalSandboxRuntime(LocalExecutor(config, host=local_host), config, seal_key=b"k" * 32)
    yield built
    await built.aclose()


async def _sh(sandbox: LocalSandbox, script: str) -> str:
    output, code = await run_in_sandbox(sandbox, "sh", "-c", script)
    assert code == 0, (script, output)
    return output


async def _write(sandbox: LocalSandbox, word: str) -> None:
    await _sh(sandbox, f"echo {word} > /tmp/cmd && cat /tmp/ack")


async def _content(sandbox: LocalSandbox) -> str:
    return (await _sh(sandbox, "head -c 4 /home/user/db")).strip()


async def test_writes_through_a_shared_mapping_are_checkpointed_and_rolled_back(
    runtime: LocalSandboxRuntime,
) -> None:
    limits = ResourceLimits(disk=64 << 20)
    sandbox = await runtime.start(
        LaunchSpec(image="host", env={}, limits=limits, timeout=120, restore=None)
    )
    try:
        await _sh(
            sandbox,
            f"setsid python3 -c '{MAPPER}' >/dev/null 2>&1 </dev/null & "
            "for i in $(seq 500); do [ -p /tmp/ack ] && break; sleep 0.01; done; [ -p /tmp/ack ]",
        )
        await _write(sandbox, "BBBB")  # the first write faults: ctime moves this once
        parts = runtime._executor.parts(sandbox._inner._run_id)
        assert parts is not None and parts.volume is not None
        db = parts.volume.workspace / "db"
        ctime = db.stat().st_ctime_ns
        deadline = time.monotonic() + 5
        while time.clock_gettime_ns(_COARSE) <= ctime + 20_000_000:
            assert time.monotonic() < deadline  # past the tick: BBBB is recorded reusable
            time.sleep(0.005)
        first = await sandbox.checkpoint()
        await _write(sandbox, "CCCC")
        assert db.stat().st_ctime_ns == ctime, "a write through the mapping moves no ctime"
        second = await sandbox.checkpoint()
        await _write(sandbox, "DDDD")
        await sandbox.rollback(second.id)
        assert await _content(sandbox) == "CCCC"  # the second checkpoint saw the change
        await sandbox.rollback(first.id)
        assert await _content(sandbox) == "BBBB"  # and the rollback rewrote the file
    finally:
        await sandbox.kill()

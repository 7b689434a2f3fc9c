"""Helpers for the attack tests: scripts to run inside a sandbox, and evidence from the host.

Kept free of fixtures (this is not a conftest) so that each test reads as: run the attack,
then look, from the host, at what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringfence.backends.local import LocalExecutor
from ringfence.errors import ExecutionNotFound
from ringfence.models import ExecutionRequest, ExecutionResult, Status

RESULT_PREFIX = "RESULT "
TRUNCATION_MARKER = re.compile(r"\[ringfence: (\d+) bytes of output cut here\]")


# Inside a sandboxed python script: print its evidence in the form ``reported`` reads.
REPORT = """
import json as _json
def report(value):
    print("RESULT " + _json.dumps(value), flush=True)
"""


def marker(kind: str = "marker") -> str:
    """A string unique to one test, to find its processes and files."""
    return f"ringfence-attack-{kind}-{uuid.uuid4().hex}"


def python(script: str, *args: str) -> list[str]:
    """The command that runs ``script`` with the sandbox's (the host's) python3; the script
    may call ``report(value)`` to print its evidence for ``reported``."""
    return ["python3", "-c", REPORT + textwrap.dedent(script), *args]


def reported(result: ExecutionResult) -> Any:
    """The JSON a sandboxed script printed on its ``RESULT`` line (its evidence)."""
    lines = [line for line in result.logs.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(lines) == 1, (
        f"the script did not report exactly once (status {result.status.value}, "
        f"error {result.error!r}); its output:\n{result.logs[-4000:]}"
    )
    return json.loads(lines[0][len(RESULT_PREFIX) :])


async def eventually(
    probe: Callable[[], Any],
    *,
    timeout: float = 5.0,
    interval: float = 0.01,
    what: str = "a condition",
) -> Any:
    """Poll ``probe`` (a function or a coroutine function) until it returns something true;
    fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


async def start(executor: Any, request: ExecutionRequest) -> asyncio.Task[ExecutionResult]:
    """Start ``request`` concurrently and return once the executor reports it running."""
    task = asyncio.create_task(executor.execute(request))

    async def running() -> bool:
        if task.done():
            result = task.result()
            raise AssertionError(f"the execution ended before it was seen running: {result}")
        try:
            status = (await executor.get_status(request.id)).status
        except ExecutionNotFound:
            return False
        return status is Status.RUNNING

    await eventually(running, timeout=10.0, what=f"execution {request.id} to run")
    return task


# -- evidence from the host ------------------------------------------------------------------


def pids_with_argument(argument: str) -> list[int]:
    """Host pids of the live processes that have ``argument`` as one of their arguments.

    A process already killed but not yet reaped has an empty command line: it does not count.
    """
    wanted = argument.encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in words:
            found.append(int(entry.name))
    return found


def named(pids: list[int], name: str) -> list[int]:
    """Those of ``pids`` whose process name is ``name`` (bwrap's own processes carry the
    sandboxed command line among their arguments too)."""
    found = []
    for pid in pids:
        try:
            if proc_status(pid)["Name"] == name:
                found.append(pid)
        except OSError:  # gone meanwhile (ENOENT, or ESRCH while it exits)
            pass
    return found


def _cgroup_mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        if tail.split()[:1] in (["cgroup"], ["cgroup2"]):
            points.append(head.split()[4])
    return points


def cgroup_dirs(execution_id: str) -> list[Path]:
    """Every cgroup directory on the host named after the execution (``rf-<id>``)."""
    name = f"rf-{execution_id}"
    found = []
    for mountpoint in _cgroup_mountpoints():
        for root, dirs, _ in os.walk(mountpoint):
            if name in dirs:
                found.append(Path(root, name))
    return found


def pids_cgroup_dir(dirs: list[Path]) -> Path:
    """The one of ``dirs`` that carries the pids controller."""
    with_pids = [d for d in dirs if (d / "pids.max").exists()]
    assert len(with_pids) == 1, f"expected one pids cgroup among {dirs}"
    return with_pids[0]


def cgroup_procs(dirs: list[Path]) -> set[int]:
    procs: set[int] = set()
    for directory in dirs:
        with contextlib.suppress(FileNotFoundError):
            procs.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
    return procs


def read_counter(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise AssertionError(f"no {key} in {path}")


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict of field -> value."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def vm_kib(field: str) -> int:
    """A ``VmXXX`` field of this process's status, in KiB."""
    return int(proc_status(os.getpid())[field].split()[0])


def host_ipv4_addresses() -> set[str]:
    """Every IPv4 address assigned to the host (from the kernel's local routing table)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    return {
        previous.split()[-1]
        for previous, line in itertools.pairwise(lines)
        if line.strip() == "/32 host LOCAL"
    }


class RootInside(LocalExecutor):
    """Runs every request as an interactive sandbox's command runs as root inside (issue
    16): reserved, so in a two-id user namespace as ns root with Docker's capabilities, on
    a volume with a writable root. The attack tests run on it too: the defences must hold."""

    async def execute(self, request: ExecutionRequest, **kwargs: Any) -> ExecutionResult:
        self.reserve(request.id)
        try:
            return await super().execute(request, **kwargs)
        finally:
            self.unreserve(request.id)

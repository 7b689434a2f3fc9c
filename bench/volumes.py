"""What volumes cost (issue 17, item 3), with baselines from the same run. A report: it never
fails on timing. Run as root on a host with the local backend:

    PYTHONPATH=src .venv/bin/python bench/volumes.py [-n 10]

Lines, each a p50 over ``-n`` runs (the server in process, on the real local backend):

* volume create (1 GiB: a sparse image and mkfs.ext4), and its first file call (the mount)
  against a later one;
* sandbox create with one volume mounted, against one without (pool off for both);
* 64 MiB written inside a sandbox (dd, fsync) to a volume, against its own /home/user (tmpfs);
* 64 MiB uploaded through ``PUT /v1/volumes/{v}/files``, against the same to a sandbox's file.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from ringfence.audit.signing import SealKey
from ringfence.backends.local import LocalExecutor
from ringfence.compose import build_services
from ringfence.config import Config
from ringfence.models import Role
from ringfence.server import create_app
from ringfence.service.credentials import CredentialKey
from ringfence.service.keys import mint_key
from ringfence.store import MemoryStore

OCTETS = {"content-type": "application/octet-stream"}
MiB = 1 << 20


async def _p50(runs: int, once: Callable[[int], Awaitable[float]]) -> float:
    return statistics.median([await once(n) for n in range(runs)])


async def main(runs: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="rf-bench-volumes-"))
    config = Config(pool_sizes={}, data_dir=data_dir)
    store = MemoryStore()
    services = await build_services(
        config, store=store, executor=LocalExecutor(config), seal_key=SealKey.generate(),
        credentials=CredentialKey.generate(),
    )  # fmt: skip
    app = create_app(services)
    headers = {"Authorization": f"Bearer {await mint_key(store, 'bench', Role.AGENT)}"}
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://bench", headers=headers, timeout=120
        ) as client,
    ):
        lines = await _measure(client, runs)
    await services.aclose()
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name:<{width}}  {value}")


async def _measure(client: httpx.AsyncClient, runs: int) -> list[tuple[str, str]]:
    async def timed(call: Awaitable[httpx.Response]) -> tuple[float, httpx.Response]:
        start = time.perf_counter()
        answer = await call
        assert answer.is_success, answer.text
        return (time.perf_counter() - start) * 1000, answer

    first_calls: list[float] = []
    later_calls: list[float] = []

    async def create_volume(n: int) -> float:
        ms, _ = await timed(client.post("/v1/volumes", json={"name": f"b{n}"}))
        stat = client.get(f"/v1/volumes/b{n}/stat", params={"path": "/"})
        first_calls.append((await timed(stat))[0])
        stat = client.get(f"/v1/volumes/b{n}/stat", params={"path": "/"})
        later_calls.append((await timed(stat))[0])
        return ms

    create = await _p50(runs, create_volume)

    async def sandbox(spec: dict[str, object]) -> tuple[float, str]:
        ms, answer = await timed(client.post("/v1/sandboxes", json=spec))
        sandbox_id: str = answer.json()["id"]
        return ms, sandbox_id

    async def start(volumes: bool) -> float:
        spec = {"volumes": [{"name": "b0", "path": "/mnt/b"}]} if volumes else {}
        ms, sandbox_id = await sandbox(spec)
        await client.delete(f"/v1/sandboxes/{sandbox_id}")
        return ms

    plain = await _p50(runs, lambda n: start(False))
    mounted = await _p50(runs, lambda n: start(True))

    _, sandbox_id = await sandbox({"volumes": [{"name": "b0", "path": "/mnt/b"}],
                                   "limits": {"disk": "256M"}})  # fmt: skip
    code = (
        "import os, time\n"
        "def write(path):\n"
        "    start = time.perf_counter()\n"
        "    with open(path, 'wb') as f:\n"
        "        for _ in range(64): f.write(b'x' * (1 << 20))\n"
        "        f.flush(); os.fsync(f.fileno())\n"
        "    took = (time.perf_counter() - start) * 1000\n"
        "    os.remove(path)\n"
        "    return took\n"
        "print(sorted(write('{path}') for _ in range(3))[1])\n"
    )
    inside = {}
    for where, path in (("volume", "/mnt/b/big"), ("tmpfs", "/home/user/big")):
        ran = await client.post(f"/v1/sandboxes/{sandbox_id}/code/execute",
                                json={"code": code.format(path=path)})  # fmt: skip
        text = "".join(line for line in ran.text.splitlines() if '"stdout"' in line)
        inside[where] = text.split('"text":"')[-1].split("\\n")[0]
    blob = b"y" * (64 * MiB)
    upload_volume = statistics.median([
        (await timed(client.put("/v1/volumes/b0/files", params={"path": "up"}, content=blob,
                                headers=OCTETS)))[0]
        for _ in range(3)
    ])  # fmt: skip
    upload_sandbox = statistics.median([
        (await timed(client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "up"},
                                content=blob, headers=OCTETS)))[0]
        for _ in range(3)
    ])  # fmt: skip
    await client.delete(f"/v1/sandboxes/{sandbox_id}")
    return [
        ("volume create, 1 GiB (p50)", f"{create:.1f} ms"),
        (
            "first file call of a volume: its mount (p50)",
            f"{statistics.median(first_calls):.1f} ms",
        ),
        ("a later file call (p50)", f"{statistics.median(later_calls):.1f} ms"),
        ("sandbox create, no volume (p50)", f"{plain:.1f} ms"),
        ("sandbox create, one volume (p50)", f"{mounted:.1f} ms"),
        ("64 MiB + fsync inside, to a volume (median of 3)", f"{float(inside['volume']):.1f} ms"),
        ("64 MiB + fsync inside, to /home/user (median of 3)", f"{float(inside['tmpfs']):.1f} ms"),
        ("64 MiB PUT to a volume (median of 3)", f"{upload_volume:.1f} ms"),
        ("64 MiB PUT to a sandbox's file (median of 3)", f"{upload_sandbox:.1f} ms"),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))

"""What a preview URL adds: first byte through the port route vs a direct connection inside.

The script starts a real ``ringfence serve``, creates a sandbox and runs a small web server
in it on 127.0.0.1:8000 (``tests/server/port_app.py``). Then, taking turns, in rounds:

* direct: from inside the sandbox (a Python loop run there), a new TCP connection to the
  server, ``GET /echo``, until the first byte of the answer;
* through Ringfence: from the host, ``GET /v1/sandboxes/{id}/ports/8000/echo`` on a
  kept-alive connection to Ringfence (what a browser or SDK holds), until the first byte of
  the answer: the server authenticates the key, opens a tunnel through the sandbox's daemon
  (a new unix connection, the daemon's loopback connect) and relays the request;
* through Ringfence, a new connection each time (a first visit).

It prints the medians (and p90) and the difference against the goal (<= 2 ms added at p50,
kept-alive). A report: it never fails on timing. ``--rounds`` and ``--per-round`` size it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx
from exec_latency import progress
from sandbox_latency import STREAM, create_sandbox, envelope, events, rpc, running_server

GOAL_ADDED_MS = 2.0
INSIDE_PORT = 8000
APP = Path(__file__).resolve().parents[1] / "tests" / "server" / "port_app.py"
# Run inside the sandbox: N first-byte times to the app, new connection each, as JSON.
DIRECT = """
import json, socket, sys, time
n, port = int(sys.argv[1]), int(sys.argv[2])
request = b"GET /echo HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n"
times = []
for _ in range(n):
    begun = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(request)
    s.recv(1)
    times.append(time.perf_counter() - begun)
    while s.recv(65536):
        pass
    s.close()
print(json.dumps(times))
"""


async def run_inside(
    client: httpx.AsyncClient, sandbox_id: str, argv: list[str], **envs: str
) -> str:
    """Run ``argv`` in the sandbox; its stdout."""
    import base64

    body = envelope({"process": {"cmd": argv[0], "args": argv[1:], "envs": envs}})
    out = b""
    async with client.stream("POST", rpc(sandbox_id), headers=STREAM, content=body) as response:
        async for event in events(response):
            if "data" in event and event["data"].get("stdout"):
                out += base64.b64decode(event["data"]["stdout"])
    return out.decode()


def first_byte_through(
    address: tuple[str, int], request: bytes, sock: socket.socket | None
) -> tuple[float, socket.socket]:
    """One request on ``sock`` (a new connection when None): seconds to the first byte of
    the answer; the answer is read whole (Content-Length) before returning."""
    begun = time.perf_counter()
    if sock is None:
        sock = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(request)
    data = sock.recv(65536)
    elapsed = time.perf_counter() - begun
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the port route answered {head[:200]!r}")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return elapsed, sock


def ms(samples: list[float], q: float = 0.5) -> float:
    if q == 0.5:
        return statistics.median(samples) * 1000
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q * 100) - 1] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=60)
    args = parser.parse_args()
    with running_server() as server:
        headers = {"Authorization": f"Bearer {server.key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as client:
            sandbox_id = await create_sandbox(client)
            await run_inside(
                client, sandbox_id,
                ["/bin/sh", "-c", f'python3 -c "$APP" {INSIDE_PORT} >/tmp/app.log 2>&1 &'],
                APP=APP.read_text(),
            )  # fmt: skip
            path = f"/v1/sandboxes/{sandbox_id}/ports/{INSIDE_PORT}/echo"
            deadline = time.monotonic() + 20
            while (await client.get(path)).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("the app in the sandbox did not start")
                await asyncio.sleep(0.05)
            address = ("127.0.0.1", server.port)
            auth = f"Authorization: Bearer {server.key}"
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n\r\n".encode()
            direct: list[float] = []
            kept: list[float] = []
            fresh: list[float] = []
            for round_ in range(args.rounds):
                progress(f"round {round_ + 1}/{args.rounds}")
                out = await run_inside(
                    client, sandbox_id,
                    ["python3", "-c", DIRECT, str(args.per_round), str(INSIDE_PORT)],
                )  # fmt: skip
                direct += json.loads(out)
                sock: socket.socket | None = None
                for _ in range(args.per_round):
                    elapsed, sock = await asyncio.to_thread(
                        first_byte_through, address, request, sock
                    )
                    kept.append(elapsed)
                assert sock is not None
                sock.close()
                for _ in range(args.per_round):
                    elapsed, fresh_sock = await asyncio.to_thread(
                        first_byte_through, address, request, None
                    )
                    fresh_sock.close()
                    fresh.append(elapsed)
            await client.delete(f"/v1/sandboxes/{sandbox_id}")
    added = ms(kept) - ms(direct)
    print(f"first byte, {len(direct)} samples each (p50 / p90, ms):")
    for name, samples in (
        ("direct, inside the sandbox (new connection)", direct),
        ("through the port route (kept-alive)", kept),
        ("through the port route (new connection)", fresh),
    ):
        print(f"  {name:46} {ms(samples):7.3f} / {ms(samples, 0.9):7.3f}")
    verdict = "holds" if added <= GOAL_ADDED_MS else "MISSED"
    print(f"added at p50 (kept-alive): {added:.3f} ms; goal <= {GOAL_ADDED_MS:g} ms: {verdict}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""What a network policy costs: the added time to start a sandbox, and the proxy's added
latency per request, each against a direct baseline measured in the same run.

1. Start: ``/bin/true`` on the local backend without a policy and with one (the proxy and
   the resolver attached to the sandbox's loopback), taking turns, ``--iterations`` each.
2. Per request, from inside one sandbox, taking turns request by request:
   * a plain-HTTP GET on a new connection through the proxy to an origin on the host,
     against the same GET straight to the same origin code run inside the sandbox (the
     sandbox has no other way to reach anything: that is the point);
   * a round trip (5 bytes each way) over an open CONNECT tunnel, against the same round
     trip over an open direct connection to the in-sandbox origin.
The origin is the same small threaded server in both places. Run as root on an idle
machine: ``.venv/bin/python bench/network.py [--iterations N] [--json]``. A report: the exit
status is 0 whatever the timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from exec_latency import Stats, at_least, host_facts, progress

from ringfence.backends.local import LocalExecutor
from ringfence.config import Config
from ringfence.models import ExecutionRequest, NetworkPolicy, Status
from ringfence.network import EgressGateway, Resolver

ORIGIN = r"""
import socket, sys, threading
def serve(conn):
    with conn, conn.makefile("rb") as f:
        line = f.readline()
        if line.startswith(b"GET"):
            while f.readline() not in (b"\r\n", b""):
                pass
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            return
        while line:
            conn.sendall(b"pong\n")
            line = f.readline()
def run(port, ready=None):
    server = socket.create_server(("127.0.0.1", port))
    if ready is not None:
        ready.set()
    else:
        print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

CLIENT = r"""
import json, socket, sys, threading, time
N, HOST_PORT = int(sys.argv[1]), int(sys.argv[2])
ready = threading.Event()
threading.Thread(target=run, args=(18080, ready), daemon=True).start()
ready.wait()
def get(address, head):
    s = socket.create_connection(address)
    s.sendall(head)
    while s.recv(65536):
        pass
    s.close()
via_proxy = (f"GET http://origin.test:{HOST_PORT}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n").encode()
direct = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
out = {"proxy_get": [], "direct_get": [], "tunnel_rtt": [], "direct_rtt": []}
for i in range(N + 5):
    for key, address, head in (("proxy_get", ("127.0.0.1", 3128), via_proxy),
                               ("direct_get", ("127.0.0.1", 18080), direct))[:: 1 if i % 2 else -1]:
        t = time.perf_counter(); get(address, head); d = time.perf_counter() - t
        if i >= 5:
            out[key].append(d)
tunnel = socket.create_connection(("127.0.0.1", 3128))
tunnel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
tunnel.sendall(f"CONNECT origin.test:{HOST_PORT} HTTP/1.1\r\n\r\n".encode())
assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
plain = socket.create_connection(("127.0.0.1", 18080))
plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for i in range(N + 5):
    for key, s in (("tunnel_rtt", tunnel), ("direct_rtt", plain))[:: 1 if i % 2 else -1]:
        t = time.perf_counter(); s.sendall(b"ping\n"); s.recv(16); d = time.perf_counter() - t
        if i >= 5:
            out[key].append(d)
print("RESULT " + json.dumps(out))
"""


def ms(samples: list[float]) -> dict[str, float]:
    stats = Stats.of(samples)
    assert stats is not None
    return {"median": stats.median * 1e3, "p90": stats.p90 * 1e3, "p99": stats.p99 * 1e3}


async def measure_start(executor: LocalExecutor, policy: NetworkPolicy, n: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"without": [], "with": [], "attach": []}
    attach = executor.egress.attach

    async def timed_attach(*args: Any, **kwargs: Any) -> Any:  # the attach step alone
        started = time.perf_counter()
        try:
            return await attach(*args, **kwargs)
        finally:
            samples["attach"].append(time.perf_counter() - started)

    executor.egress.attach = timed_attach  # type: ignore[method-assign]
    for i in range(n + 5):
        order = [("without", None), ("with", policy)][:: 1 if i % 2 else -1]
        for key, network in order:
            started = time.perf_counter()
            result = await executor.execute(
                ExecutionRequest(command=["/bin/true"], network=network)
            )
            elapsed = time.perf_counter() - started
            if result.status is not Status.SUCCEEDED:
                raise SystemExit(f"a start failed: {result.error} {result.logs}")
            if i >= 5:
                samples[key].append(elapsed)
    samples["attach"] = samples["attach"][5:]
    return {key: ms(values) for key, values in samples.items()}


async def measure_requests(executor: LocalExecutor, policy: NetworkPolicy, port: int,
                           n: int) -> dict[str, Any]:  # fmt: skip
    script = ORIGIN + CLIENT
    request = ExecutionRequest(
        command=["python3", "-c", script, str(n), str(port)], network=policy, timeout=600
    )
    result = await executor.execute(request)
    line = next((x for x in result.logs.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"the in-sandbox client failed: {result.error}\n{result.logs[-3000:]}")
    raw: dict[str, list[float]] = json.loads(line.removeprefix("RESULT "))
    return {key: ms(values) for key, values in raw.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=at_least(5), default=100)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    origin = subprocess.Popen(
        [sys.executable, "-c", ORIGIN + "run(0)"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert origin.stdout is not None
        port = int(origin.stdout.readline())
        resolver = Resolver({"origin.test": ["127.0.0.1"]}, system=False)
        executor = LocalExecutor(Config(), egress=EgressGateway(resolver))
        policy = NetworkPolicy.model_validate(
            {"rules": [{"domain": "origin.test", "cidr": "127.0.0.1/32", "ports": [port]}]}
        )
        progress(f"start: {args.iterations} sandboxes without and with a policy, in turns")
        start = await measure_start(executor, policy, args.iterations)
        progress(f"requests: {args.iterations} of each kind from inside one sandbox")
        requests = await measure_requests(executor, policy, port, args.iterations)
        await executor.aclose()
    finally:
        origin.kill()
        origin.wait()
    added_start = start["with"]["median"] - start["without"]["median"]
    added_get = requests["proxy_get"]["median"] - requests["direct_get"]["median"]
    added_rtt = requests["tunnel_rtt"]["median"] - requests["direct_rtt"]["median"]
    print(f"host: {host_facts(None)}")
    print(f"{'':46} {'median':>8} {'p90':>8} {'p99':>8}   (ms)")
    rows = [
        ("start /bin/true, no network", start["without"]),
        ("start /bin/true, with a policy", start["with"]),
        ("  of which: attaching proxy and resolver", start["attach"]),
        ("GET, new connection, through the proxy", requests["proxy_get"]),
        ("GET, new connection, direct (in sandbox)", requests["direct_get"]),
        ("round trip in an open CONNECT tunnel", requests["tunnel_rtt"]),
        ("round trip in an open direct connection", requests["direct_rtt"]),
    ]
    for name, row in rows:
        print(f"{name:46} {row['median']:8.3f} {row['p90']:8.3f} {row['p99']:8.3f}")
    print(f"added to start (median): {added_start:.3f} ms (goal: at most 10 ms)")
    print(f"added per request (median): new connection {added_get:.3f} ms, "
          f"open tunnel {added_rtt:.3f} ms (goal: at most 2 ms)")  # fmt: skip
    if args.json:
        print(json.dumps({"start": start, "requests": requests, "added_start_ms": added_start,
                          "added_get_ms": added_get, "added_tunnel_rtt_ms": added_rtt,
                          "iterations": args.iterations}))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())

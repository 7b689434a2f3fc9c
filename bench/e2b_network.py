"""What E2B's network options cost: the mapping onto Ringfence's egress policy, and a create
through E2B's official SDK with and without them.

Part one times ``server.e2b.network.egress_policy`` (pure: E2B's options in, a checked
``NetworkPolicy`` out) on a typical ask: three ``allow_out`` entries, a ``deny_out`` range,
a header transform, under a tenant default with an allow and a deny rule.

Part two starts a real ``ringfence serve`` (a fresh data directory, no warm pool) whose
operator default for the tenant allows one name, and times, taking turns round by round,
``e2b.Sandbox.create(...)`` plus one ``commands.run("true")`` for: no options (the tenant's
default policy), ``allow_internet_access=False``, and ``allow_out`` with ``deny_out`` all
traffic. Nothing is fetched: every case attaches the egress proxy, which is the difference
E2B's options could make. Each sandbox is killed afterwards (not counted). This is a report:
it never fails on timing. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import timeit
from typing import Any

from sandbox_latency import running_server

from ringfence.config import Config
from ringfence.server.e2b.network import UPDATE, NetworkUpdate, egress_policy

DEFAULT = {"rules": [
    {"domain": "pypi.org", "ports": [443]},
    {"domain": "evil.example", "action": "deny"},
]}  # fmt: skip
ASKED = {
    "allowOut": ["api.example.com", "1.1.1.1", "*.github.com"],
    "denyOut": ["8.8.8.0/24"],
    "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer x"}}}]},
}
CASES: dict[str, dict[str, Any]] = {
    "no options (the tenant's default)": {},
    "allow_internet_access=False": {"allow_internet_access": False},
    "allow_out + deny_out all traffic": {
        "network": {"allow_out": ["pypi.org", "api.example.com"], "deny_out": ["0.0.0.0/0"]}
    },
}


def mapping_seconds(rounds: int) -> float:
    config = Config(network_defaults={"default": DEFAULT}, pool_sizes={})
    asked = NetworkUpdate.model_validate(ASKED)
    total = timeit.timeit(
        lambda: egress_policy(None, asked, "default", config, UPDATE), number=rounds
    )
    return total / rounds


def creates(rounds: int) -> dict[str, list[float]]:
    os.environ["RINGFENCE_NETWORK_DEFAULTS"] = json.dumps({"default": DEFAULT})
    with running_server() as server:
        os.environ.update(
            E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=server.key
        )
        from e2b import Sandbox  # after the environment points at the server

        times: dict[str, list[float]] = {name: [] for name in CASES}
        for _ in range(rounds):
            for name, options in CASES.items():
                start = time.perf_counter()
                sbx = Sandbox.create(**options)
                sbx.commands.run("true")
                times[name].append(time.perf_counter() - start)
                sbx.kill()
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="sandboxes per case")
    parser.add_argument("--json", action="store_true", help="one JSON line, no table")
    args = parser.parse_args()
    mapping = mapping_seconds(2000)
    times = creates(args.rounds)
    lines = {
        name: {
            "p50": round(statistics.median(values) * 1e3, 1),
            "max": round(max(values) * 1e3, 1),
            "n": len(values),
        }
        for name, values in times.items()
    }
    mapping_us = round(mapping * 1e6, 1)
    if args.json:
        print(json.dumps({"mapping_us": mapping_us, "create_and_run_ms": lines}))
        return
    print(f"mapping: {mapping_us} us per policy")
    for name, line in lines.items():
        print(f"{name}: p50 {line['p50']} ms, max {line['max']} ms (n={line['n']})")


if __name__ == "__main__":
    main()

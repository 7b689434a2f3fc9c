"""PTY echo round trip: a key typed into a sandbox terminal through the server, until its
echo comes back on the terminal's stream.

The script starts a real ``ringfence serve`` on a loopback port (a fresh data directory, its
first admin key), creates one sandbox and drives it with httpx as a client would. In one run,
taking turns round by round, it measures (over ``_lean_http``'s client: httpx's async client
adds some 3 ms a request, which the native SDK line shows):

* ``pty echo (raw cat)``: a terminal running ``cat`` in raw mode (``stty raw -echo``: the
  echo is cat's own write, so the byte crosses the pty both ways); one byte sent with
  ``SendInput{pty}`` (``POST .../rpc/process.Process/SendInput``) until that byte arrives as
  ``data{pty}`` on the terminal's open ``Start`` stream;
* ``pty echo (bash readline)``: the same with the SDKs' default terminal, ``/bin/bash -i -l``,
  whose readline echoes the key itself (a backspace after each, not counted, keeps the line
  empty);
* ``pty echo at the daemon's socket``: the raw cat line straight to the sandbox daemon's unix
  socket on the host (no API in between): the API's share is the difference;
* ``pty echo (native SDK)``: ``term.send_input(b"x")`` on ``ringfence.client.AsyncSandbox``'s
  ``pty`` until ``on_data`` has the echo (raw cat again);
* the floors: ``command round trip`` (``Start`` of ``/bin/true`` until its end event, what
  one command costs) and ``unary RPC round trip`` (``process.Process/List``: the least a
  ``SendInput`` can cost).

Goal: the raw cat line's p50 at most 5 ms. This is a report: it never fails on timing. See
bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lean_http import LeanClient
from exec_latency import RunFailed, Stats, at_least, host_facts, progress
from sandbox_latency import (
    STREAM,
    Goal,
    Line,
    Phases,
    Run,
    Server,
    create_sandbox,
    daemon_socket,
    envelope,
    events,
    kill_sandbox,
    measure,
    ms,
    round_trip_runner,
    rpc,
    running_server,
    text,
)

from ringfence.backends.local.probe import bwrap_choice
from ringfence.config import Config

GOAL_ECHO_MS = 5.0  # PTY echo round trip, p50
RAW_CAT = ["/bin/sh", "-c", "stty raw -echo; echo ready; exec cat"]
LOGIN_SHELL = ["/bin/bash", "-i", "-l"]
SIZE = {"size": {"rows": 24, "cols": 80}}
READY_SECONDS = 30.0


class Terminal:
    """A terminal in the sandbox with its ``Start`` stream read by a task into a queue: the
    stream on a connection of its own (``stream``), input sent on ``client``'s."""

    def __init__(self, stream: LeanClient, client: LeanClient, base: str) -> None:
        self.stream = stream
        self.client = client
        self.base = base  # where process.Process's methods are: the API's, or the daemon's
        self.output: asyncio.Queue[bytes] = asyncio.Queue()
        self.pid = 0
        self._reader: asyncio.Task[None] | None = None
        self._started = asyncio.get_running_loop().create_future()

    async def open(self, cmd: Sequence[str], ready: bytes) -> None:
        """Start ``cmd`` on a terminal; return once it has written ``ready``."""
        self._reader = asyncio.create_task(self._read(cmd))
        self.pid = await asyncio.wait_for(asyncio.shield(self._started), READY_SECONDS)
        await self.read_until(ready)

    async def _read(self, cmd: Sequence[str]) -> None:
        body = envelope({"process": {"cmd": cmd[0], "args": list(cmd[1:])}, "pty": SIZE})
        try:
            async with self.stream.stream(
                "POST", f"{self.base}/Start", headers=STREAM, content=body
            ) as response:
                if response.status_code != 200:
                    raise RunFailed(f"Start: HTTP {response.status_code}")
                async for event in events(response):
                    if "start" in event and not self._started.done():
                        self._started.set_result(event["start"]["pid"])
                    elif "data" in event and event["data"].get("pty"):
                        self.output.put_nowait(base64.b64decode(event["data"]["pty"]))
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    async def send(self, data: bytes) -> None:
        message = {"process": {"pid": self.pid}, "input": {"pty": base64.b64encode(data).decode()}}
        response = await self.client.post(f"{self.base}/SendInput", json=message)
        if response.status_code != 200:
            raise RunFailed(f"SendInput: HTTP {response.status_code}: {response.text[:300]}")

    async def read_until(self, needle: bytes) -> None:
        seen = b""
        async with asyncio.timeout(READY_SECONDS):
            while needle not in seen:
                seen += await self.output.get()

    async def close(self) -> None:
        message = {"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"}
        await self.client.post(f"{self.base}/SendSignal", json=message)
        if self._reader is not None:  # the kill ends its stream
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, READY_SECONDS)


def echo_runner(term: Terminal, key: bytes, after: bytes = b"", after_echo: bytes = b"") -> Run:
    """``key`` typed until it is echoed; then ``after`` typed until ``after_echo`` (not
    counted: it puts the terminal back as it was)."""

    async def run() -> Phases:
        begun = time.perf_counter()
        await term.send(key)
        sent = time.perf_counter() - begun
        await term.read_until(key)
        total = time.perf_counter() - begun
        if after:
            await term.send(after)
            await term.read_until(after_echo)
        return {"total": total, "SendInput answered": sent}

    return run


def native_runner(server: Server, sandbox_id: str) -> tuple[Run, Any]:
    """The native SDK's terminal: a run and the coroutine that closes it."""
    from ringfence.client import AsyncSandbox

    state: dict[str, Any] = {}
    arrived: asyncio.Queue[bytes] = asyncio.Queue()

    async def run() -> Phases:
        if not state:
            sbx = await AsyncSandbox.connect(sandbox_id, url=server.url, api_key=server.key)
            term = await sbx.pty.create(cmd=RAW_CAT, on_data=arrived.put_nowait)
            state.update(sbx=sbx, term=term)
            await _until(arrived, b"ready")
        begun = time.perf_counter()
        await state["term"].send_input(b"x")
        await _until(arrived, b"x")
        return {"total": time.perf_counter() - begun}

    async def close() -> None:
        if state:
            await state["term"].kill()
            await state["sbx"].aclose()

    return run, close


async def _until(queue: asyncio.Queue[bytes], needle: bytes) -> None:
    seen = b""
    async with asyncio.timeout(READY_SECONDS):
        while needle not in seen:
            seen += await queue.get()


def unary_runner(client: LeanClient, sandbox_id: str) -> Run:
    path = f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/List"

    async def run() -> Phases:
        begun = time.perf_counter()
        response = await client.post(path, json={})
        if response.status_code != 200:
            raise RunFailed(f"List: HTTP {response.status_code}")
        return {"total": time.perf_counter() - begun}

    return run


@dataclass
class Report:
    host: dict[str, str | int]
    rounds: int
    lines: list[Line]

    def goal(self) -> Goal:
        stats = Stats.of(self.lines[0].totals)
        return Goal(
            f"PTY echo round trip (raw cat) p50 <= {GOAL_ECHO_MS:g} ms",
            GOAL_ECHO_MS,
            ms(stats.median) if stats else None,
        )

    def to_json(self) -> dict[str, Any]:
        lines = {}
        for line in self.lines:
            stats = Stats.of(line.totals)
            lines[line.key] = {
                "name": line.name,
                "command": line.command,
                "n": len(line.totals),
                "p50_ms": ms(stats.median) if stats else None,
                "p90_ms": ms(stats.p90) if stats else None,
                "p99_ms": ms(stats.p99) if stats else None,
                "failure": line.failure,
            }
        goal = self.goal()
        return {
            "host": self.host,
            "rounds": self.rounds,
            "lines": lines,
            "goal": {"text": goal.text, "measured_ms": goal.measured_ms, "verdict": goal.verdict},
        }

    def render(self) -> str:
        out = [
            "PTY echo round trip through the server (one key typed -> its echo read back)",
            f"host: {self.host}",
            f"{self.rounds} rounds per line, taking turns",
            "",
            f"{'line':<36} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}",
        ]
        for line in self.lines:
            stats = Stats.of(line.totals)
            if line.failure:
                out.append(f"{line.name:<36} FAILED: {line.failure}")
                continue
            p50, p90, p99 = (stats.median, stats.p90, stats.p99) if stats else (None, None, None)
            out.append(f"{line.name:<36} {text(p50):>9} {text(p90):>9} {text(p99):>9}")
        goal = self.goal()
        out += ["", f"goal: {goal.text}: {goal.verdict} ({goal.measured_ms} ms)"]
        out += ["", "What each line runs:"]
        out += [f"  {line.name}: {line.command}" for line in self.lines]
        return "\n".join(out)


async def benchmark(args: argparse.Namespace, server: Server) -> Report:
    async with (
        server.lean_client() as client,
        server.lean_client() as cat_stream,
        server.lean_client() as shell_stream,
    ):
        sandbox_id = await create_sandbox(client)
        api = f"/v1/sandboxes/{sandbox_id}/rpc/process.Process"
        cat = Terminal(cat_stream, client, api)
        shell = Terminal(shell_stream, client, api)
        socket = daemon_socket(server, Config(backend="local"))
        direct = None
        if socket is not None:  # the daemon's own socket, on the host: no API in between
            own = {"uds": str(socket)}
            direct = Terminal(
                LeanClient("http://sandbox", {}, **own),
                LeanClient("http://sandbox", {}, **own),
                "/process.Process",
            )
        native, close_native = native_runner(server, sandbox_id)
        try:
            await cat.open(RAW_CAT, b"ready")
            await shell.open(LOGIN_SHELL, b"$ ")
            if direct is not None:
                await direct.open(RAW_CAT, b"ready")
            lines = [
                Line(
                    "pty_raw_cat", "pty echo (raw cat)",
                    f"{RAW_CAT} on a pty; SendInput{{pty: 'x'}} until 'x' comes back",
                    echo_runner(cat, b"x"),
                ),
                Line(
                    "pty_bash", "pty echo (bash readline)",
                    f"{LOGIN_SHELL} on a pty; 'x' until its echo (then a backspace, uncounted)",
                    echo_runner(shell, b"x", b"\x7f", b"\b"),
                ),
                Line(
                    "pty_native_sdk", "pty echo (native SDK)",
                    "AsyncSandbox.pty.create(cmd=raw cat, on_data=...); send_input(b'x') "
                    "until on_data has it",
                    native,
                ),
                *(
                    [Line(
                        "pty_daemon_socket", "pty echo at the daemon's socket",
                        "the raw cat line sent straight to the sandbox daemon's unix socket "
                        "(no API in between): the API's share is the difference",
                        echo_runner(direct, b"x"),
                    )] if direct is not None else []
                ),
                Line(
                    "command_round_trip", "command round trip (floor)",
                    "Start of /bin/true until its end event",
                    round_trip_runner(client, rpc(sandbox_id)),
                ),
                Line(
                    "unary_round_trip", "unary RPC round trip (floor)",
                    "POST .../rpc/process.Process/List",
                    unary_runner(client, sandbox_id),
                ),
            ]  # fmt: skip
            await measure(lines, args.rounds, args.warmup, "pty echo")
        finally:
            await close_native()
            for term in (cat, shell, *([direct] if direct is not None else [])):
                await term.close()
            await kill_sandbox(client, sandbox_id)
    host = host_facts(shutil.which(bwrap_choice(Config(backend="local"))))
    return Report(host, args.rounds, lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least(1), default=500, help="per line (500)")
    parser.add_argument("--warmup", type=at_least(0), default=20, help="rounds not counted (20)")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with running_server() as server:
        try:
            report = asyncio.run(benchmark(args, server))
        except Exception:
            progress(f"the server's log ends with:\n{server.log_tail()}")
            raise
    print(report.render())
    if args.json:
        print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

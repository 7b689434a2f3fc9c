"""How fast an interactive sandbox becomes usable, and how fast it runs a command, over HTTP.

The script starts a real ``ringfence serve`` on a loopback port (a fresh data directory, its
first admin key) and drives it with httpx as a client would. One run measures:

* time to interactive: from ``POST /v1/sandboxes`` to the first stdout byte of ``echo hi``
  started in the new sandbox (``POST .../rpc/process.Process/Start``), one sandbox after
  another, each killed afterwards (the kill is timed but not counted);
* command round trip: in one live sandbox, ``Start`` of ``/bin/true`` until its end event.

Beside them, measured in the same run and taking turns with them: raw bubblewrap (the floor a
sandbox cannot go under), bubblewrap shaped like Ringfence's sandbox, the sandbox daemon
started alone on the host (no sandbox), a one-shot execution over HTTP, the API's own round
trip (``GET /v1/health``), a call straight to the daemon's socket (no API in between), and
docker (``run -d`` + ``exec``) when a docker daemon answers. This is a report: it never fails
on timing. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _lean_http import LeanClient
from exec_latency import (
    RunFailed,
    Stats,
    at_least,
    host_facts,
    progress,
    raw_bwrap_argv,
    ringfence_shaped_bwrap_argv,
    run_command,
)

from ringfence.backends.local.interactive import prepare_daemon
from ringfence.backends.local.probe import bwrap_choice
from ringfence.config import Config

GOAL_TTI_MS = 50.0  # time to interactive, p50, without a warm pool
GOAL_ROUND_TRIP_MS = 5.0  # command round trip, p50
ECHO = ["echo", "hi"]
TRUE = "/bin/true"
DOCKER_IMAGE = "ringfence-bench-sandbox:latest"
DOCKER_APPLETS = ("sh", "true", "echo", "cat", "sleep")
SANDBOX_TIMEOUT = 120  # seconds: a sandbox the script loses track of dies on its own
SERVER_START_SECONDS = 30.0
QUERY_TIMEOUT = 15.0
STREAM = {"content-type": "application/connect+json"}

Phases = dict[str, float]
"""Seconds spent in each named phase of one run; ``total`` is what the line is judged on."""
Run = Callable[[], Awaitable[Phases]]


# -- a real server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """``ringfence serve`` as a child process on a loopback port, with a fresh data dir."""

    def __init__(self, workdir: Path) -> None:
        self.data_dir = workdir / "data"
        self.log_path = workdir / "server.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.key = ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        """Start it and wait until it answers. Raises ``RuntimeError`` with its log if not."""
        ringfence = Path(sys.executable).parent / "ringfence"
        argv = [str(ringfence), "serve", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        # No warm pool unless the caller set one (pool_and_code.py does): these lines
        # measure sandboxes started on demand, and idle pooled ones would skew memory.
        env = {**os.environ}
        env.setdefault("RINGFENCE_POOL_SIZES", "{}")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + SERVER_START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ringfence serve exited: {self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    self.key = (self.data_dir / "admin-key").read_text().strip()
                    return
            time.sleep(0.05)
        raise RuntimeError(f"ringfence serve did not answer in {SERVER_START_SECONDS:g} s")

    def stop(self) -> None:
        """SIGTERM (the server kills its sandboxes), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def client(self, timeout: float = 60) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)

    def lean_client(self) -> LeanClient:
        return LeanClient(self.url, {"Authorization": f"Bearer {self.key}"})


@contextlib.contextmanager
def running_server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="rf-bench-") as workdir:
        server = Server(Path(workdir))
        try:
            progress(f"starting ringfence serve on {server.url}")
            server.start()
            yield server
        finally:
            server.stop()


Client = httpx.AsyncClient | LeanClient


# -- talking to a sandbox -----------------------------------------------------------------------


def envelope(message: dict[str, Any]) -> bytes:
    """One Connect envelope (flags 0) holding ``message`` as JSON."""
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def start_body(cmd: Sequence[str]) -> bytes:
    return envelope({"process": {"cmd": cmd[0], "args": list(cmd[1:])}})


async def events(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The events of a streamed Start answer as they arrive. Raises ``RunFailed`` on an
    end-of-stream message carrying an error."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + length:
                break
            message = json.loads(buffer[5 : 5 + length])
            buffer = buffer[5 + length :]
            if flags & 2:
                if message.get("error"):
                    raise RunFailed(f"Start failed: {message['error']}")
                return
            yield message["event"]


async def start_command(client: Client, path: str, cmd: Sequence[str], begun: float) -> Phases:
    """Run ``cmd`` with ``Start`` at ``path``; return when each event came, from ``begun``."""
    marks: Phases = {}
    async with client.stream("POST", path, headers=STREAM, content=start_body(cmd)) as response:
        if response.status_code != 200:
            raise RunFailed(
                f"Start: HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            )
        async for event in events(response):
            now = time.perf_counter() - begun
            if "start" in event:
                marks.setdefault("start_event", now)
            elif "data" in event and event["data"].get("stdout"):
                if base64.b64decode(event["data"]["stdout"]):
                    marks.setdefault("first_stdout", now)
            elif "end" in event:
                marks["end_event"] = now
                if event["end"].get("exitCode", 0) != 0:
                    raise RunFailed(f"{shlex.join(cmd)} ended with {event['end']}")
    if "end_event" not in marks:
        raise RunFailed(f"{shlex.join(cmd)}: the stream ended without an end event")
    return marks


async def create_sandbox(client: Client, **spec: Any) -> str:
    response = await client.post("/v1/sandboxes", json={"timeout": SANDBOX_TIMEOUT, **spec})
    if response.status_code != 201:
        raise RunFailed(f"create: HTTP {response.status_code}: {response.text[:300]}")
    sandbox_id: str = response.json()["id"]
    return sandbox_id


async def kill_sandbox(client: Client, sandbox_id: str) -> None:
    response = await client.delete(f"/v1/sandboxes/{sandbox_id}")
    if response.status_code != 200:
        raise RunFailed(f"kill: HTTP {response.status_code}: {response.text[:300]}")


def rpc(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{sandbox_id}/rpc/process.Process/Start"


# -- the lines ----------------------------------------------------------------------------------


@dataclass
class Line:
    """One thing measured, and what its runs measured."""

    key: str
    name: str
    command: str
    run: Run
    samples: dict[str, list[float]] = field(default_factory=dict)  # phase -> seconds
    failure: str | None = None

    @property
    def totals(self) -> list[float]:
        return self.samples.get("total", [])


def tti_runner(client: Client) -> Run:
    """Create a sandbox, run ``echo hi`` until its first stdout byte, then kill it."""

    async def run() -> Phases:
        begun = time.perf_counter()
        sandbox_id = await create_sandbox(client)
        created = time.perf_counter() - begun
        try:
            marks = await start_command(client, rpc(sandbox_id), ECHO, begun)
        finally:
            before_kill = time.perf_counter()
            await kill_sandbox(client, sandbox_id)
            kill = time.perf_counter() - before_kill
        if "first_stdout" not in marks:
            raise RunFailed("echo hi printed nothing")
        return {
            "total": marks["first_stdout"],
            "create (POST /v1/sandboxes)": created,
            "Start sent -> start event": marks["start_event"] - created,
            "start event -> first stdout": marks["first_stdout"] - marks["start_event"],
            "kill (not counted)": kill,
        }

    return run


def execution_runner(client: Client) -> Run:
    """A one-shot execution of /bin/true over HTTP: a sandbox without the daemon."""

    async def run() -> Phases:
        begun = time.perf_counter()
        response = await client.post("/v1/executions", json={"command": [TRUE]})
        elapsed = time.perf_counter() - begun
        if response.status_code not in (200, 201) or response.json().get("status") != "succeeded":
            raise RunFailed(f"execution: HTTP {response.status_code}: {response.text[:300]}")
        return {"total": elapsed}

    return run


def blocking(argv: Sequence[str]) -> Run:
    """``subprocess.run`` on the loop's thread: nothing else runs during a sequential round."""

    async def run() -> Phases:
        begun = time.perf_counter()
        run_command(argv)
        return {"total": time.perf_counter() - begun}

    return run


def daemon_alone_runner(daemon_dir: Path, socket_dir: Path, uid: int | None) -> Run:
    """The sandbox daemon started on the host, outside any sandbox, until it answers /health
    (what Ringfence's create waits for): the cost of starting the daemon itself."""
    boot = f"import sys; sys.path.insert(0, {str(daemon_dir.parent)!r}); import sandboxd.__main__"
    path = socket_dir / "daemon.sock"
    as_user: dict[str, Any] = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}

    async def run() -> Phases:
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(16)
        begun = time.perf_counter()
        try:
            daemon = subprocess.Popen(
                [
                    "/usr/bin/python3",
                    "-I",
                    "-S",
                    "-B",
                    "-c",
                    boot,
                    "--listen-fd",
                    str(listener.fileno()),
                ],
                pass_fds=(listener.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                **as_user,
            )
        finally:
            listener.close()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(str(path))
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
                answer = conn.recv(4096)
            elapsed = time.perf_counter() - begun
        except OSError as exc:
            raise RunFailed(f"daemon alone: {exc}") from exc
        finally:
            daemon.kill()
            daemon.wait()
        if not answer.startswith(b"HTTP/1.1 204"):
            raise RunFailed(f"daemon alone answered {answer[:100]!r}")
        return {"total": elapsed}

    return run


def round_trip_runner(client: Client, path: str) -> Run:
    async def run() -> Phases:
        begun = time.perf_counter()
        marks = await start_command(client, path, [TRUE], begun)
        return {"total": marks["end_event"], "Start sent -> start event": marks["start_event"]}

    return run


def health_runner(client: Client) -> Run:
    async def run() -> Phases:
        begun = time.perf_counter()
        response = await client.get("/v1/health")
        if response.status_code != 200:
            raise RunFailed(f"health: HTTP {response.status_code}")
        return {"total": time.perf_counter() - begun}

    return run


# -- docker ---------------------------------------------------------------------------------------


class Docker:
    """docker, when its daemon answers; started here only when asked (``--docker``)."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.dockerd: subprocess.Popen[bytes] | None = None
        self.imported = False
        self.containers: list[str] = []

    def available(self, start_daemon: bool, workdir: Path) -> str | None:
        """None if docker can be measured; else why not."""
        if shutil.which("docker") is None:
            return "docker is not installed"
        if not self._answers():
            if not start_daemon:
                return "no docker daemon answers `docker info` (--docker starts one)"
            if shutil.which("dockerd") is None:
                return "no docker daemon, and dockerd is not installed"
            progress("starting dockerd (--docker)")
            with (workdir / "dockerd.log").open("wb") as log:
                self.dockerd = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 60
            while not self._answers():
                if time.monotonic() > deadline or self.dockerd.poll() is not None:
                    return "dockerd did not come up: " + _tail(workdir / "dockerd.log")
                time.sleep(0.5)
        if not self._has_image():
            if not start_daemon:
                return f"no image {self.image} (--docker makes it from a static busybox)"
            why = self._import_busybox(workdir)
            if why is not None:
                return why
        try:
            cid = self.run_detached()
            self.exec(cid, ECHO)
            self.remove(cid)
        except RunFailed as exc:
            return f"a probe container failed: {exc}"
        return None

    def _answers(self) -> bool:
        try:
            run_command(["docker", "info"], timeout=QUERY_TIMEOUT)
        except RunFailed:
            return False
        return True

    def _has_image(self) -> bool:
        try:
            run_command(["docker", "image", "inspect", self.image], timeout=QUERY_TIMEOUT)
        except RunFailed:
            return False
        return True

    def _import_busybox(self, workdir: Path) -> str | None:
        busybox = shutil.which("busybox")
        if busybox is None:
            return f"no image {self.image} and no busybox to make it from"
        rootfs = workdir / "rootfs"
        for sub in ("bin", "proc", "dev", "sys", "etc", "tmp"):
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        for applet in DOCKER_APPLETS:
            (rootfs / "bin" / applet).symlink_to("busybox")
        tar = workdir / "rootfs.tar"
        try:
            run_command(["tar", "-C", str(rootfs), "-cf", str(tar), "."])
            run_command(["docker", "import", str(tar), self.image], timeout=120)
        except RunFailed as exc:
            return f"could not make {self.image}: {exc}"
        self.imported = True
        progress(f"made docker image {self.image} from {busybox}")
        return None

    def run_detached(self) -> str:
        """A container kept alive by an open stdin (``-i``): an idle interactive shell."""
        argv = ["docker", "run", "-d", "-i", "--network", "none", self.image, "sh"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RunFailed(f"docker run: {done.stderr.strip()[-300:]}")
        cid = done.stdout.strip()
        self.containers.append(cid)
        return cid

    def exec(self, cid: str, cmd: Sequence[str]) -> float:
        """Run ``cmd`` in the container; seconds until its first stdout byte (or its end if
        it prints nothing)."""
        begun = time.perf_counter()
        child = subprocess.Popen(["docker", "exec", cid, *cmd], stdout=subprocess.PIPE)
        assert child.stdout is not None
        first = child.stdout.read(1)
        elapsed = time.perf_counter() - begun
        child.stdout.read()
        if child.wait(timeout=60) != 0 or (cmd == ECHO and not first):
            raise RunFailed(f"docker exec {shlex.join(cmd)}: exit status {child.returncode}")
        return elapsed if first else time.perf_counter() - begun

    def remove(self, cid: str) -> None:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=60, check=False)
        with contextlib.suppress(ValueError):
            self.containers.remove(cid)

    def close(self) -> None:
        for cid in list(self.containers):
            self.remove(cid)
        if self.imported:
            subprocess.run(["docker", "rmi", self.image], capture_output=True, check=False)
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.send_signal(signal.SIGTERM)
            try:
                self.dockerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.dockerd.kill()
                self.dockerd.wait()


def docker_tti_runner(docker: Docker) -> Run:
    async def run() -> Phases:
        begun = time.perf_counter()
        cid = docker.run_detached()
        created = time.perf_counter() - begun
        try:
            first = docker.exec(cid, ECHO)
        finally:
            before_kill = time.perf_counter()
            docker.remove(cid)
            kill = time.perf_counter() - before_kill
        return {
            "total": created + first,
            "create (docker run -d)": created,
            "docker exec -> first stdout": first,
            "kill (not counted)": kill,
        }

    return run


def docker_exec_runner(docker: Docker, cid: str) -> Run:
    async def run() -> Phases:
        return {"total": docker.exec(cid, ["true"])}

    return run


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return " | ".join(text.strip().splitlines()[-lines:])


# -- measuring ----------------------------------------------------------------------------------


async def measure(lines: Sequence[Line], iterations: int, warmup: int, label: str) -> None:
    """One run of every line per round, rotating who goes first, so drift hits all alike."""
    rounds = warmup + iterations
    step = max(1, rounds // 10)
    for i in range(rounds):
        shift = i % len(lines)
        for line in [*lines[shift:], *lines[:shift]]:
            if line.failure is not None:
                continue
            try:
                phases = await line.run()
            except (RunFailed, httpx.HTTPError, OSError, subprocess.SubprocessError) as exc:
                line.failure = f"run {i + 1} failed: {type(exc).__name__}: {exc}"
                continue
            if i >= warmup:
                for phase, seconds in phases.items():
                    line.samples.setdefault(phase, []).append(seconds)
        if (i + 1) % step == 0 or i + 1 == rounds:
            progress(f"{label}: {i + 1}/{rounds} rounds ({warmup} warm-up)")


# -- reporting ----------------------------------------------------------------------------------


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


@dataclass(frozen=True)
class Goal:
    text: str
    limit_ms: float
    measured_ms: float | None

    @property
    def verdict(self) -> str:
        if self.measured_ms is None:
            return "UNKNOWN"
        return "PASS" if self.measured_ms <= self.limit_ms else "MISS"


@dataclass
class Report:
    host: dict[str, str | int]
    sandboxes: int
    commands: int
    tti: list[Line]
    round_trip: list[Line]
    missing: dict[str, str]

    def line(self, key: str) -> Line | None:
        return next((x for x in [*self.tti, *self.round_trip] if x.key == key), None)

    def median(self, key: str) -> float | None:
        line = self.line(key)
        return statistics.median(line.totals) if line and line.totals else None

    @property
    def goals(self) -> list[Goal]:
        return [
            Goal(
                f"time to interactive p50 <= {GOAL_TTI_MS:g} ms (no warm pool)",
                GOAL_TTI_MS,
                ms(self.median("ringfence_tti")),
            ),
            Goal(
                f"command round trip p50 <= {GOAL_ROUND_TRIP_MS:g} ms",
                GOAL_ROUND_TRIP_MS,
                ms(self.median("ringfence_round_trip")),
            ),
        ]

    def table(self, title: str, lines: Sequence[Line], base: str) -> list[str]:
        floor = self.median(base)
        out = [
            title,
            f"{'name':<40} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'x ' + base:>18}",
        ]
        for line in lines:
            stats = Stats.of(line.totals)
            median = stats.median if stats else None
            ratio = "-" if median is None or not floor else f"{median / floor:.2f}"
            top = max(line.totals) if line.totals else None
            p99 = stats.p99 if stats else None
            out.append(
                f"{line.name:<40} {text(median):>9} {text(p99):>9} {text(top):>9} {ratio:>18}"
            )
            if line.failure:
                out.append(f"{'':<40} stopped after {len(line.totals)} runs: {line.failure}")
        return out

    def breakdown(self, lines: Sequence[Line]) -> list[str]:
        out: list[str] = []
        for line in lines:
            phases = [p for p in line.samples if p != "total"]
            if not phases:
                continue
            out.append(f"  {line.name}:")
            for phase in phases:
                values = line.samples[phase]
                share = ""
                if "not counted" not in phase and line.totals:
                    share = f" ({statistics.median(values) / statistics.median(line.totals):.0%})"
                out.append(f"    {phase:<36} p50 {text(statistics.median(values)):>8} ms{share}")
        return out

    def render(self) -> str:
        host = ", ".join(f"{k} {v}" for k, v in self.host.items())
        out = [f"host: {host}", ""]
        out += self.table(
            f"Time to interactive: {self.sandboxes} sandboxes, one after another "
            "(ringfence: POST /v1/sandboxes -> first stdout byte of `echo hi`)",
            self.tti,
            "raw_bwrap",
        )
        out += ["", "  p50 of each phase (share of the line's p50):", *self.breakdown(self.tti)]
        out += [""]
        out += self.table(
            f"Command round trip: {self.commands} commands in one live sandbox/container "
            "(ringfence: Start /bin/true -> end event)",
            self.round_trip,
            "api_health",
        )
        out += ["", "  p50 of each phase:", *self.breakdown(self.round_trip)]
        for key, reason in self.missing.items():
            out.append(f"{key}: not measured: {reason}")
        out += ["", "what each line is:"]
        out += [f"  {x.name}: {x.command}" for x in [*self.tti, *self.round_trip]]
        out += ["", "Goals (timings on a shared 2-core machine are noisy; a report, not a test):"]
        for goal in self.goals:
            measured = "-" if goal.measured_ms is None else f"{goal.measured_ms:.2f} ms"
            out.append(f"  {goal.text}: {goal.verdict} (measured {measured})")
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        def lines(group: Sequence[Line]) -> list[dict[str, Any]]:
            result = []
            for line in group:
                stats = Stats.of(line.totals)
                result.append({
                    "key": line.key,
                    "name": line.name,
                    "command": line.command,
                    "samples": len(line.totals),
                    "failure": line.failure,
                    "p50_ms": ms(stats.median if stats else None),
                    "p90_ms": ms(stats.p90 if stats else None),
                    "p99_ms": ms(stats.p99 if stats else None),
                    "max_ms": ms(max(line.totals) if line.totals else None),
                    "phases_p50_ms": {
                        phase: ms(statistics.median(values))
                        for phase, values in line.samples.items()
                        if phase != "total"
                    },
                })  # fmt: skip
            return result

        return {
            "benchmark": "sandbox_latency",
            "host": self.host,
            "sandboxes": self.sandboxes,
            "commands": self.commands,
            "time_to_interactive": lines(self.tti),
            "round_trip": lines(self.round_trip),
            "not_measured": self.missing,
            "goals": [
                {
                    "goal": g.text,
                    "limit_ms": g.limit_ms,
                    "p50_ms": g.measured_ms,
                    "verdict": g.verdict,
                }
                for g in self.goals
            ],
        }


# -- main ---------------------------------------------------------------------------------------


def daemon_socket(server: Server, config: Config) -> Path | None:
    """The unix socket of the server's one live sandbox (its daemon's listening socket)."""
    found = sorted((config.runtime_dir / "sockets" / f"i{server.pid}").glob("*.sock"))
    return found[0] if len(found) == 1 else None


async def benchmark(args: argparse.Namespace, server: Server, workdir: Path) -> Report:
    config = Config(backend="local")
    bwrap = shutil.which(bwrap_choice(config))  # the one Ringfence runs: the floor's too
    missing: dict[str, str] = {}
    docker = Docker(args.image)
    why_not_docker = "skipped (--no-docker)" if args.no_docker else None
    if why_not_docker is None:
        progress("probing docker")
        why_not_docker = docker.available(args.docker, workdir)
    if why_not_docker is not None:
        missing["docker"] = why_not_docker

    daemon_root = workdir / "runtime"
    daemon_root.mkdir(mode=0o755)
    workdir.chmod(0o755)  # the daemon runs as the sandbox uid: it must reach its package
    daemon_dir = prepare_daemon(daemon_root)
    uid = config.sandbox_uids[0] if os.geteuid() == 0 else None  # as a sandbox would run

    try:
        async with server.client() as sdk_client, server.lean_client() as client:
            tti = [
                Line(
                    "ringfence_tti",
                    "ringfence sandbox (HTTP API)",
                    "POST /v1/sandboxes, then POST .../rpc/process.Process/Start of `echo hi` "
                    "until the first stdout byte; DELETE afterwards (timed, not counted); "
                    "a lean HTTP/1.1 client (h11, one kept-alive connection)",
                    tti_runner(client),
                ),
                Line(
                    "ringfence_tti_httpx",
                    "  the same through httpx (SDK's client)",
                    "the line above with httpx.AsyncClient, the SDK's HTTP client",
                    tti_runner(sdk_client),
                ),
                Line(
                    "ringfence_execution",
                    "ringfence one-shot execution (HTTP)",
                    f"POST /v1/executions {{command: [{TRUE}]}} until its result: a sandbox "
                    "with every isolation layer, no daemon, torn down",
                    execution_runner(client),
                ),
                Line(
                    "daemon_alone",
                    "sandbox daemon alone, no sandbox",
                    "the daemon's exact python3 command on the host (as the sandbox uid) "
                    "until it answers GET /health on its socket",
                    daemon_alone_runner(daemon_dir, workdir, uid),
                ),
            ]
            if bwrap is None:
                missing["raw_bwrap"] = f"{config.bwrap_path} not found"
            else:
                floor, shaped = raw_bwrap_argv(bwrap), ringfence_shaped_bwrap_argv(bwrap)
                tti += [
                    Line(
                        "raw_bwrap",
                        "raw bwrap /bin/true (floor)",
                        shlex.join(floor),
                        blocking(floor),
                    ),
                    Line(
                        "shaped_bwrap",
                        "bwrap shaped like Ringfence's",
                        "Ringfence's namespaces and mounts, no seccomp/cgroup/uid drop: "
                        + shlex.join(shaped),
                        blocking(shaped),
                    ),
                ]
            if why_not_docker is None:
                tti.append(
                    Line(
                        "docker_tti",
                        "docker run -d + docker exec",
                        f"docker run -d -i --network none {args.image} sh, then docker exec "
                        "CID echo hi until its first stdout byte; docker rm -f afterwards "
                        "(timed, not counted)",
                        docker_tti_runner(docker),
                    )
                )
            await measure(tti, args.sandboxes, args.warmup, "time to interactive")

            sandbox_id = await create_sandbox(client)
            try:
                round_trip = [
                    Line(
                        "ringfence_round_trip",
                        "ringfence Start /bin/true (HTTP API)",
                        f"POST /v1/sandboxes/ID/rpc/process.Process/Start {{cmd: {TRUE}}} "
                        "until the end event",
                        round_trip_runner(client, rpc(sandbox_id)),
                    ),
                    Line(
                        "ringfence_round_trip_httpx",
                        "  the same through httpx (SDK's client)",
                        "the line above with httpx.AsyncClient, the SDK's HTTP client",
                        round_trip_runner(sdk_client, rpc(sandbox_id)),
                    ),
                    Line(
                        "api_health",
                        "API round trip, no sandbox",
                        "GET /v1/health on the same connection",
                        health_runner(client),
                    ),
                    Line(
                        "api_health_httpx",
                        "  the same through httpx (SDK's client)",
                        "GET /v1/health with httpx.AsyncClient",
                        health_runner(sdk_client),
                    ),
                    Line(
                        "host_true",
                        "plain /bin/true on the host",
                        f"subprocess.run([{TRUE!r}])",
                        blocking([TRUE]),
                    ),
                ]
                path = daemon_socket(server, config)
                direct: httpx.AsyncClient | None = None
                if path is None:
                    missing["daemon_direct"] = "the daemon's socket was not found"
                else:
                    transport = httpx.AsyncHTTPTransport(uds=str(path))
                    direct = httpx.AsyncClient(
                        base_url="http://sandbox", transport=transport, timeout=60
                    )
                    round_trip.insert(
                        2,
                        Line(
                            "daemon_direct",
                            "daemon's socket, no API in between",
                            f"Start {{cmd: {TRUE}}} to {path} until the end event",
                            round_trip_runner(direct, "/process.Process/Start"),
                        ),
                    )
                cid: str | None = None
                if why_not_docker is None:
                    cid = docker.run_detached()
                    round_trip.append(
                        Line(
                            "docker_exec",
                            "docker exec true",
                            "docker exec CID true, in one live container",
                            docker_exec_runner(docker, cid),
                        )
                    )
                try:
                    await measure(round_trip, args.commands, args.warmup, "round trip")
                finally:
                    if direct is not None:
                        await direct.aclose()
                    if cid is not None:
                        docker.remove(cid)
            finally:
                await kill_sandbox(client, sandbox_id)
    finally:
        docker.close()

    return Report(
        host=host_facts(bwrap),
        sandboxes=args.sandboxes,
        commands=args.commands,
        tti=tti,
        round_trip=round_trip,
        missing=missing,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time to interactive and command round trip of Ringfence's interactive "
        "sandboxes over HTTP, next to raw bubblewrap and (when its daemon answers) docker. "
        "Exits 0 once it has run: timings are reported, never asserted."
    )
    parser.add_argument(
        "-n",
        "--sandboxes",
        type=at_least(1),
        default=None,
        help="sandboxes created for time to interactive (default 50; 10 with --quick)",
    )
    parser.add_argument(
        "--commands",
        type=at_least(1),
        default=None,
        help="commands for the round trip (default 200; 50 with --quick)",
    )
    parser.add_argument(
        "--warmup", type=at_least(0), default=3, help="unmeasured rounds first (default 3)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer runs: a smoke test")
    parser.add_argument(
        "--docker",
        action="store_true",
        help="start dockerd if none answers and make the image if it is missing (both "
        "undone at the end)",
    )
    parser.add_argument("--no-docker", action="store_true", help="never measure docker")
    parser.add_argument(
        "--image",
        default=DOCKER_IMAGE,
        help=f"docker image with sh, echo and true (default {DOCKER_IMAGE})",
    )
    parser.add_argument(
        "--json", action="store_true", help="also print the results as one line of JSON, last"
    )
    args = parser.parse_args(argv)
    if args.sandboxes is None:
        args.sandboxes = 10 if args.quick else 50
    if args.commands is None:
        args.commands = 50 if args.quick else 200
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rf-bench-") as workdir, running_server() as server:
        try:
            report = asyncio.run(benchmark(args, server, Path(workdir)))
        except Exception:
            progress(f"the server's log ends with:\n{server.log_tail()}")
            raise
    print(report.render())
    if args.json:
        print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

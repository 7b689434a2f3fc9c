"""A real sandboxd subprocess on a unix socket, and a tiny Connect client for it."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ringfence" / "sandboxd"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class Daemon:
    def __init__(self, tmp: Path, home: Path) -> None:
        self.path = str(tmp / "sandboxd.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        self.home = home
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
        code = f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); import sandboxd.__main__"
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [PYTHON, "-I", "-S", "-B", "-c", code, "--listen-fd", str(listener.fileno())],
            pass_fds=[listener.fileno()],
            env=env,
        )
        listener.close()
        self.client = httpx.Client(
            transport=httpx.HTTPTransport(uds=self.path), base_url="http://sandbox", timeout=30
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def unary(self, method: str, body: Any, **headers: str) -> httpx.Response:
        return self.client.post(
            f"/{method}",
            content=body if isinstance(body, bytes) else json.dumps(body).encode(),
            headers={"content-type": "application/json", **headers},
        )

    def stream(
        self, method: str, body: Any, *, end_after: float = 0.0, **headers: str
    ) -> Iterator[dict[str, Any]]:
        """The messages of a server stream, the end-stream frame last (as {"_end": ...}).

        The request body is chunked: the envelope, then (``end_after`` seconds later, as a
        slow client or a proxy may do) its terminating empty chunk.
        """
        payload = json.dumps(body).encode()
        frame = struct.pack(">BI", 0, len(payload)) + payload

        def content() -> Iterator[bytes]:
            yield frame
            if end_after:
                time.sleep(end_after)

        with self.client.stream(
            "POST",
            f"/{method}",
            content=content(),
            headers={"content-type": "application/connect+json", **headers},
        ) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"] == "application/connect+json"
            yield from parse_frames(response.iter_raw())


def parse_frames(chunks: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    buf = b""
    for chunk in chunks:
        buf += chunk
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if len(buf) < 5 + size:
                break
            message = json.loads(buf[5 : 5 + size])
            buf = buf[5 + size :]
            yield {"_end": message} if flags & 2 else message


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def output(events: list[dict[str, Any]], name: str = "stdout") -> bytes:
    return b"".join(
        base64.b64decode(e["event"]["data"][name])
        for e in events
        if "event" in e and name in e["event"].get("data", {})
    )


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sandboxd")
    home = tmp / "home"
    home.mkdir()
    d = Daemon(tmp, home)
    try:
        wait_for(lambda: d.client.get("/health").status_code == 204)
        yield d
    finally:
        d.client.close()
        d.proc.kill()
        d.proc.wait()

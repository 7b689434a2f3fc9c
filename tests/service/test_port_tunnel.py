"""The host's side of a port tunnel against a hostile daemon: what it hands over must be
a connected TCP socket, or nothing is used (the descriptor is closed)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ringfence.errors import SandboxError
from ringfence.service.port_tunnel import open_tunnel

_HEAD = b"HTTP/1.1 200 OK\r\nRingfence-Fd: 1\r\nContent-Length: 0\r\n\r\n"


def _hostile_daemon(path: Path, make_fd: Callable[[], int]) -> threading.Thread:
    """A 'daemon' that answers one request handing over ``make_fd()``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                fd = make_fd()
                socket.send_fds(conn, [_HEAD], [fd])
                os.close(fd)
                conn.recv(1)  # until the host closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _pipe_fd() -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def _listening_fd() -> int:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    return listening.detach()


@pytest.mark.parametrize("make_fd", [_pipe_fd, _listening_fd], ids=["a pipe", "a listener"])
async def test_a_handed_over_descriptor_that_is_no_connected_tcp_socket_is_refused(
    tmp_path: Path, make_fd: Callable[[], int]
) -> None:
    before = len(os.listdir("/proc/self/fd"))
    thread = _hostile_daemon(tmp_path / "d.sock", make_fd)
    with pytest.raises(SandboxError) as refused:
        await open_tunnel(str(tmp_path / "d.sock"), "sbx", 8000)
    assert refused.value.code == "sandbox_error"
    thread.join(timeout=10)
    assert len(os.listdir("/proc/self/fd")) <= before  # nothing handed over is kept


async def test_a_daemon_behind_a_tcp_relay_splices_instead(tmp_path: Path) -> None:
    """A Pod's daemon listens on TCP (reached through the control plane's relay): it cannot
    hand a socket over, so the upgraded connection is the pipe, bytes both ways."""
    import subprocess

    from ringfence.backends.kubernetes._relay import Relay
    from tests.sandboxd.conftest import PACKAGE, PYTHON

    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(1)

    def serve_echo() -> None:
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    threading.Thread(target=serve_echo, daemon=True).start()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    code = f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); import sandboxd.__main__"
    daemon = subprocess.Popen(
        [PYTHON, "-I", "-S", "-B", "-c", code, "--listen-fd", str(listener.fileno())],
        pass_fds=[listener.fileno()], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    relay = Relay(tmp_path / "relay.sock", "127.0.0.1", listener.getsockname()[1])
    await relay.start()
    try:
        pipe = await open_tunnel(str(tmp_path / "relay.sock"), "sbx", echo.getsockname()[1])
        assert pipe.writer.get_extra_info("socket").family == socket.AF_UNIX
        pipe.writer.write(b"through the relay")
        await pipe.writer.drain()
        assert await pipe.reader.readexactly(17) == b"THROUGH THE RELAY"
        await pipe.aclose()
    finally:
        await relay.aclose()
        listener.close()
        echo.close()
        daemon.kill()
        daemon.wait()

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

"""The HTTP and Connect layers: bad input, limits, and what the package may import."""

from __future__ import annotations

import ast
import socket
import struct
import sys

from .conftest import PACKAGE, PYTHON, Daemon


def raw(daemon: Daemon, data: bytes) -> bytes:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(daemon.path)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def test_health(daemon: Daemon) -> None:
    assert daemon.client.get("/health").status_code == 204


def test_unknown_path_and_method(daemon: Daemon) -> None:
    response = daemon.client.get("/nope")
    assert response.status_code == 404 and response.json()["code"] == 404
    response = daemon.unary("process.Process/Nope", {})
    assert (response.status_code, response.json()["code"]) == (501, "unimplemented")


def test_bad_json_and_bad_base64_are_invalid_argument(daemon: Daemon) -> None:
    for body in (b"{", b"[1]", b'{"path": 1}', b'"\\ud800', b"\xff"):
        response = daemon.unary("filesystem.Filesystem/Stat", body)
        assert (response.status_code, response.json()["code"]) == (400, "invalid_argument")
    bad = {"process": {"pid": 1}, "input": {"stdin": "not base64!"}}
    response = daemon.unary("process.Process/SendInput", bad)
    assert response.json()["code"] in ("invalid_argument", "not_found")
    response = daemon.unary("process.Process/List", {"unknownField": {"x": [1]}})
    assert response.status_code == 200


def test_truncated_envelope(daemon: Daemon) -> None:
    frame = struct.pack(">BI", 0, 100) + b'{"process"'
    response = daemon.client.post(
        "/process.Process/Start",
        content=iter([frame]),
        headers={"content-type": "application/connect+json"},
    )
    assert b"invalid_argument" in response.content
    huge = struct.pack(">BI", 0, 2**31)
    response = daemon.client.post(
        "/process.Process/Start",
        content=huge,
        headers={"content-type": "application/connect+json"},
    )
    assert b"invalid_argument" in response.content
    assert daemon.client.get("/health").status_code == 204


def test_a_server_stream_request_carries_one_message(daemon: Daemon) -> None:
    frame = struct.pack(">BI", 0, 2) + b"{}"
    response = daemon.client.post(
        "/filesystem.Filesystem/WatchDir",
        content=iter([frame, frame]),
        headers={"content-type": "application/connect+json"},
    )
    assert response.content[0] == 2 and b"invalid_argument" in response.content
    assert daemon.client.get("/health").status_code == 204


def test_malformed_requests_get_400_and_the_daemon_goes_on(daemon: Daemon) -> None:
    assert raw(daemon, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    big = b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n"
    assert raw(daemon, big).startswith(b"HTTP/1.1 431")
    lines = b"".join(b"X-%d: %s\r\n" % (i, b"c" * 1000) for i in range(80))
    many = b"GET /health HTTP/1.1\r\n" + lines
    assert raw(daemon, many + b"\r\n").startswith(b"HTTP/1.1 431")
    chunked = (
        b"POST /process.Process/List HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\nzz\r\n"
    )
    assert raw(daemon, chunked) == b""  # a broken body drops the connection
    assert daemon.client.get("/health").status_code == 204


def test_keep_alive_serves_several_requests_on_one_connection(daemon: Daemon) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = raw(daemon, request * 3)
    assert answer.count(b"HTTP/1.1 204") == 3


def test_the_package_imports_only_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib and top != "ringfence", f"{path.name} imports {name}"


def test_idle_daemon_imports_no_heavy_module() -> None:
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); import sandboxd._main; "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = set(subprocess.check_output([PYTHON, "-I", "-S", "-B", "-c", code]).split())
    heavy = {
        b"asyncio",
        b"threading",
        b"json",
        b"re",
        b"socket",
        b"typing",
        b"subprocess",
        b"email",
        b"http",
        b"logging",
        b"ctypes",
        b"collections",
        b"enum",
    }
    assert not loaded & heavy

"""``/files`` over plain HTTP: download and upload, streamed in both directions.

``GET /files?path=P`` answers the bytes (Content-Length from fstat). ``POST`` or ``PUT
/files?path=P`` with an ``application/octet-stream`` body (Content-Length or chunked,
optionally ``Content-Encoding: gzip``) writes the file in place, as envd does (opened with
``O_TRUNC``, written as the body arrives): a watcher of its directory sees the file's own
CREATE and WRITE events, and a failed or aborted upload leaves what had arrived. With
``Ringfence-Commit: at-end`` it writes a temporary file beside the target instead and
renames it into place once the body is whole: a failed or aborted upload then leaves the
previous content untouched. Parent directories are created. Multipart bodies are the host's
job (it splits them into one octet-stream upload per file): they get 415. Errors are JSON
``{"code": <int>, "message"}``, as E2B's envd answers them; a full disk is 507.
"""

from __future__ import annotations

import os
import stat

from ._codec import dumps
from ._errors import RpcError, from_os_error
from ._http import Closed
from ._paths import resolve
from ._xattrs import metadata_of, read_metadata, write_metadata

__all__ = ["COMMIT_HEADER", "serve", "serve_archive"]

# ``at-end``: the upload is committed only once its body is whole (the host asks so for a
# signed URL's multipart upload, which it refuses whole should a second part follow).
COMMIT_HEADER = "ringfence-commit"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._http import Conn, Request
    from ._server import Server

_CHUNK = 256 * 1024
_KERNEL_TREES = ("/proc", "/sys", "/dev")
_STATUS = {
    "not_found": 404,
    "already_exists": 409,
    "invalid_argument": 400,
    "permission_denied": 403,
    "resource_exhausted": 507,
    "unauthenticated": 401,
}


def _error(conn: Conn, status: int, message: str) -> None:
    body = dumps({"code": status, "message": message}).encode()
    conn.respond(status, [("Content-Type", "application/json")], body)


def serve(server: Server, request: Request, conn: Conn) -> None:
    try:
        server.check_user(request)
        if request.method in ("GET", "HEAD"):
            _download(request, conn)
        elif request.method in ("POST", "PUT"):
            _upload(request, conn)
        else:
            _error(conn, 405, "use GET to download and POST or PUT to upload")
    except RpcError as err:
        _error(conn, _STATUS.get(err.code, 500), err.message)


def serve_archive(server: Server, request: Request, conn: Conn) -> None:
    """``GET /files/archive?path=DIR``: the directory as a tar stream (``archive``),
    chunked as it is read. Errors before the first byte are JSON; one after it (the
    sandbox ending) cuts the stream short, which a tar reader sees (no end marker)."""
    try:
        server.check_user(request)
        if request.method != "GET":
            _error(conn, 405, "use GET to download a directory as a tar archive")
            return
        path = resolve(request.query.get("path"))
        real = os.path.realpath(path)
        if any(p == k or p.startswith(k + "/") for k in _KERNEL_TREES for p in (path, real)):
            # Files there report sizes they do not have (a tar header promises the size).
            raise RpcError("invalid_argument", f"{path}: kernel filesystems are not archived")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise from_os_error(exc, f"open directory {path}") from None
        try:
            from .archive import tar_stream

            skip = frozenset(("proc", "sys", "dev")) if path == "/" else frozenset()
            pieces = tar_stream(fd, skip_dirs=skip)
            try:
                first = next(pieces)
            except OSError as exc:
                raise from_os_error(exc, f"list {path}") from None
            conn.start_chunked(200, "application/x-tar")
            conn.send_chunk(first)
            for piece in pieces:
                conn.send_chunk(piece)
            conn.end_chunked()
        finally:
            os.close(fd)
    except RpcError as err:
        _error(conn, _STATUS.get(err.code, 500), err.message)


def _download(request: Request, conn: Conn) -> None:
    path = resolve(request.query.get("path"))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise from_os_error(exc, f"open {path}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise RpcError("invalid_argument", f"{path} is a directory, not a file")
        headers = [("Content-Type", "application/octet-stream")]
        if not stat.S_ISREG(st.st_mode):  # a fifo or device: size unknown
            conn.start_chunked(200, "application/octet-stream")
            while data := os.read(fd, _CHUNK):
                conn.send_chunk(data)
            conn.end_chunked()
            return
        size = st.st_size
        head = [f"HTTP/1.1 200 OK\r\nContent-Length: {size}"] + [f"{k}: {v}" for k, v in headers]
        conn.send(("\r\n".join(head) + "\r\n\r\n").encode())
        if request.method == "HEAD":
            return
        _send_file(conn, fd, size)
    finally:
        os.close(fd)


def _send_file(conn: Conn, fd: int, size: int) -> None:
    """Exactly ``size`` bytes (a file that shrinks mid-way drops the connection)."""
    offset = 0
    out = conn.sock.fileno()
    while offset < size:
        try:
            sent = os.sendfile(out, fd, offset, min(size - offset, 1 << 20))
        except BlockingIOError:
            continue
        except OSError as exc:
            raise Closed(str(exc)) from None
        if sent == 0:
            raise Closed("the file shrank while it was being sent")
        offset += sent


def _upload(request: Request, conn: Conn) -> None:
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith("multipart/"):
        _error(
            conn,
            415,
            "multipart uploads are converted by the host; the sandbox daemon "
            "takes one application/octet-stream body per file",
        )
        return
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding not in ("identity", "gzip"):
        _error(conn, 415, f"Content-Encoding {encoding!r} is not supported (use gzip)")
        return
    path = resolve(request.query.get("path"))
    directory, name = os.path.split(path)
    try:
        os.makedirs(directory, exist_ok=True)
        if os.path.isdir(path):
            raise RpcError("invalid_argument", f"{path} is a directory")
    except OSError as exc:
        raise from_os_error(exc, f"create {directory}") from None
    metadata = metadata_of(request.headers)
    at_end = request.headers.get(COMMIT_HEADER, "").lower() == "at-end"
    try:
        (_write_at_end if at_end else _write_in_place)(request, conn, path, encoding == "gzip")
        write_metadata(path, metadata)
    except OSError as exc:
        raise from_os_error(exc, f"write {path}") from None
    except ValueError as exc:  # zlib.error is not an OSError
        raise RpcError("invalid_argument", f"the gzip body is corrupt: {exc}") from None
    entry: dict[str, object] = {"name": name, "type": "file", "path": path}
    if persisted := read_metadata(path):  # what was kept, not what was asked
        entry["metadata"] = persisted
    body = dumps([entry]).encode()
    conn.respond(200, [("Content-Type", "application/json")], body)


def _write_in_place(request: Request, conn: Conn, path: str, gzip: bool) -> None:
    """envd's way: open with O_TRUNC, write as the body arrives.

    Raises:
        OSError: from opening or writing (a fifo at the path fails to open, O_NONBLOCK,
            rather than hang this thread; anything but a regular file is refused).
        ValueError: a corrupt gzip body.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RpcError("invalid_argument", f"{path} is not a regular file")
        _copy_body(request, conn, fd, gzip=gzip)
    finally:
        os.close(fd)


def _write_at_end(request: Request, conn: Conn, path: str, gzip: bool) -> None:
    """A temporary file beside the target, renamed onto it once the body is whole: until
    then (and for good, should the body not end) the target keeps its content."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.upload-{os.urandom(6).hex()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    done = False
    try:
        try:
            _copy_body(request, conn, fd, gzip=gzip)
            try:  # noqa: SIM105 - contextlib costs memory
                os.chmod(temp, stat.S_IMODE(os.stat(path).st_mode))  # keep an old file's mode
            except FileNotFoundError:
                pass  # a new file
        finally:
            os.close(fd)
        os.rename(temp, path)
        done = True
    finally:
        if not done:
            try:  # noqa: SIM105 - contextlib costs memory
                os.unlink(temp)
            except OSError:
                pass  # never created or already gone


def _copy_body(request: Request, conn: Conn, fd: int, *, gzip: bool) -> None:
    """The body into ``fd``; should that fail part-way, the rest of the body is not read,
    so the connection closes after the answer.

    Raises:
        OSError: writing failed (a full disk).
        ValueError: a corrupt gzip body.
    """
    try:
        _copy(request, fd, gzip=gzip)
    except (OSError, ValueError):
        conn.close_after = True
        raise


def _copy(request: Request, fd: int, *, gzip: bool) -> None:
    inflate = None
    if gzip:
        import zlib

        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        data = request.body.read(_CHUNK)
        if not data:
            break
        if inflate is None:
            _write_all(fd, data)
            continue
        try:
            out = inflate.decompress(data, _CHUNK)
            while True:
                _write_all(fd, out)
                if not inflate.unconsumed_tail:
                    break
                out = inflate.decompress(inflate.unconsumed_tail, _CHUNK)
        except Exception as exc:  # zlib.error
            raise ValueError(str(exc)) from None
    if inflate is not None and not inflate.eof:
        raise ValueError("the gzip stream is truncated")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

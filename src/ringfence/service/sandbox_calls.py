"""Calls into a sandbox's daemon on a caller's behalf: its commands, files and code.

Both doors call here, the native ``/v1/sandboxes/{id}/...`` routes and E2B's envd and
code-interpreter routes; they differ only in how they find the caller (an API key, or an
access token or signed URL) and in the shape of what they answer. Each call:

1. finds the sandbox in the caller's tenant, running (``SandboxNotFound`` for another
   tenant's sandbox exactly as for one that never existed; ``SandboxNotRunning``);
2. keeps the users rule, when the caller's door names a user (``Forbidden`` for any but
   ``user`` and ``root``), and tells the daemon who it acts as (``?username=``);
3. classifies it by the daemon's own table (``sandboxd.methods``): what changes the
   sandbox goes on the audit record with what is kept of it (the command line, working
   directory and variable names, and a terminal's size; paths; the signal; never stdin, a
   terminal's input or variable values; text
   clipped to 2048 characters, except the path of a native write, kept whole as it was);
4. passes it to the daemon and returns its ``Answer``, bodies streamed both ways: only a
   body that is audited is read first (bounded by the server's body limit).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Protocol

from ringfence.errors import Forbidden, InvalidRequest
from ringfence.models import ResourceLimits, Sandbox
from ringfence.sandboxd.methods import CLIENT_STREAM, changes, kind_of, user_refusal
from ringfence.service.daemon_client import DaemonClient
from ringfence.service.sandbox_answers import Answer, clip

__all__ = [
    "ARCHIVE_SLACK_BYTES", "FileWriter", "SandboxCaller", "SandboxCalls", "Sandboxes",
    "archive_limit",
]  # fmt: skip

Headers = Mapping[str, str]  # the caller's request headers (only the daemon's own cross)
Body = AsyncIterable[bytes]  # the caller's request body, as it comes


ARCHIVE_SLACK_BYTES = 4 << 30  # a template's own files, which a disk limit does not count


def archive_limit(limits: ResourceLimits) -> int:
    """The most one archive of a sandbox's directory streams when the server sets none: 4
    times its disk limit (tar headers of many small files) plus ``ARCHIVE_SLACK_BYTES``
    (its template's files, read-only, are not on its disk)."""
    return 4 * (limits.disk or 0) + ARCHIVE_SLACK_BYTES


@dataclass(frozen=True)
class SandboxCaller:
    """Who calls which sandbox: the caller's tenant, the key that acts (the audit record's
    actor) and the sandbox's id."""

    tenant: str
    key_id: str
    sandbox_id: str


class Sandboxes(Protocol):
    """What the calls need of the sandbox service (``SandboxService`` is one)."""

    async def daemon(self, tenant: str, sandbox_id: str) -> DaemonClient:
        """Raises ``SandboxNotFound`` (also for another tenant's) or ``SandboxNotRunning``."""
        ...

    async def get(self, tenant: str, sandbox_id: str) -> Sandbox:
        """Raises ``SandboxNotFound`` (also for another tenant's)."""
        ...

    def record(
        self,
        tenant: str,
        actor: str,
        action: str,
        sandbox_id: str,
        outcome: str = "ok",
        details: Mapping[str, object] | None = None,
    ) -> None: ...


class SandboxCalls:
    """The daemon pass-through. Every method may raise what finding the sandbox raises
    (``SandboxNotFound``, ``SandboxNotRunning``) and what reaching its daemon raises
    (``SandboxNotRunning``, ``SandboxError``, ``TooManyRequests``, ``InvalidRequest`` for a
    header HTTP/1.1 cannot carry); those given a ``user`` raise ``Forbidden`` for any but
    the sandbox's one user."""

    def __init__(self, sandboxes: Sandboxes, *, archive_max_bytes: int | None = None) -> None:
        """``archive_max_bytes``: the most a directory's archive streams (None: from each
        sandbox's disk limit, ``archive_limit``)."""
        self._sandboxes = sandboxes
        self._archive_max_bytes = archive_max_bytes

    async def reach(self, caller: SandboxCaller) -> None:
        """Check that the caller's sandbox is there and running: its daemon answers (as
        envd's ``/health`` is envd's own answer). A sandbox being killed, its record not yet
        ended, is not running either: a client whose stream its death cut asks this.

        Raises:
            SandboxNotRunning: it has ended, or its daemon cannot be reached.
        """
        daemon = await self._daemon(caller)
        answer = await daemon.send("GET", "/health")
        await answer.aclose()

    async def rpc(
        self, caller: SandboxCaller, name: str, headers: Headers, body: Body, *,
        user: str | None = None,
    ) -> Answer:  # fmt: skip
        """Call the daemon's ``name`` ("package.Service/Method"); a method it does not
        have is passed on too, for the daemon to refuse."""
        daemon = await self._daemon(caller, user)
        method = name.rpartition("/")[2]
        path, params = f"/{name}", _as(user)
        if not changes(name):
            answer = await daemon.send("POST", path, params=params, headers=headers, content=body)
            return Answer(answer)
        if kind_of(name) == CLIENT_STREAM:  # a stream of requests: passed on as it comes
            self._record(caller, f"sandbox.{method}")
            answer = await daemon.send("POST", path, params=params, headers=headers, content=body)
            return Answer(answer)
        content = await _read(body)
        details = _audited(method, content)
        if user is not None:
            details["user"] = user
        self._record(caller, f"sandbox.{method}", details)
        answer = await daemon.send("POST", path, params=params, headers=headers, content=content)
        return Answer(answer)

    async def read_file(
        self, caller: SandboxCaller, path: str | None, headers: Headers, *,
        user: str | None = None,
    ) -> Answer:  # fmt: skip
        """Download the file at ``path`` (an attachment of opaque bytes).

        Raises:
            InvalidRequest: no ``path`` (None), checked after the one-user rule and the
                sandbox's lookup, so those refusals come first.
        """
        daemon = await self._daemon(caller, user)
        if not path:
            raise InvalidRequest("the path query parameter is required")
        params = {"path": path, **_as(user)}
        upstream = await daemon.send("GET", "/files", params=params, headers=headers)
        return Answer(upstream, download=upstream.status_code == 200)

    async def read_archive(
        self, caller: SandboxCaller, path: str | None, headers: Headers, *,
        user: str | None = None,
    ) -> Answer:  # fmt: skip
        """Download the directory at ``path`` as a tar stream (``sandboxd.archive``: what
        it stores and skips), passed on as the daemon produces it, never held whole, and
        cut (without tar's end marker) past ``archive_max_bytes`` or ``archive_limit`` of
        the sandbox's disk limit: sparse and hard-linked files inflate an archive far past
        what the disk holds.

        Raises:
            InvalidRequest: no ``path`` (None), checked as for ``read_file``.
        """
        daemon = await self._daemon(caller, user)
        if not path:
            raise InvalidRequest("the path query parameter is required")
        params = {"path": path, **_as(user)}
        cap = self._archive_max_bytes
        if cap is None:
            cap = archive_limit(
                (await self._sandboxes.get(caller.tenant, caller.sandbox_id)).limits
            )
        upstream = await daemon.send("GET", "/files/archive", params=params, headers=headers)
        return Answer(upstream, download=upstream.status_code == 200, max_bytes=cap)

    async def file_writer(
        self, caller: SandboxCaller, *, user: str | None = None, clip_paths: bool = True
    ) -> FileWriter:
        """A writer of files into the caller's sandbox (for uploads of several files). Its
        audit records keep each path clipped to 2048 characters (E2B's door), or whole
        (``clip_paths=False``, the native door)."""
        daemon = await self._daemon(caller, user)
        return FileWriter(daemon, self, caller, clip_paths=clip_paths, user=user)

    async def write_file(
        self, caller: SandboxCaller, path: str, headers: Headers, body: Body, *,
        user: str | None = None,
    ) -> Answer:  # fmt: skip
        """Upload ``body`` to ``path`` (replaced whole once the body ends); the native
        door's write, so its audit record keeps the whole path."""
        writer = await self.file_writer(caller, user=user, clip_paths=False)
        return await writer.write(path, headers, body)

    async def run_code(self, caller: SandboxCaller, headers: Headers, body: Body) -> Answer:
        """Run a cell (the body is the code request, read whole: it is audited)."""
        daemon = await self._daemon(caller)
        content = await _read(body)
        message = _message(content)
        details = {
            "code": clip(str(message.get("code", ""))),
            "context_id": message.get("context_id"),
            "language": message.get("language"),
        }
        self._record(caller, "sandbox.run_code", details)
        return Answer(await daemon.send("POST", "/execute", headers=headers, content=content))

    async def list_contexts(self, caller: SandboxCaller, headers: Headers) -> Answer:
        daemon = await self._daemon(caller)
        return Answer(await daemon.send("GET", "/contexts", headers=headers))

    async def create_context(self, caller: SandboxCaller, headers: Headers, body: Body) -> Answer:
        daemon = await self._daemon(caller)
        self._record(caller, "sandbox.create_context")
        return Answer(await daemon.send("POST", "/contexts", headers=headers, content=body))

    async def remove_context(
        self, caller: SandboxCaller, context_id: str, headers: Headers
    ) -> Answer:
        daemon = await self._daemon(caller)
        self._record(caller, "sandbox.remove_context", {"context_id": context_id})
        return Answer(await daemon.send("DELETE", f"/contexts/{context_id}", headers=headers))

    async def restart_context(
        self, caller: SandboxCaller, context_id: str, headers: Headers
    ) -> Answer:
        daemon = await self._daemon(caller)
        self._record(caller, "sandbox.restart_context", {"context_id": context_id})
        path = f"/contexts/{context_id}/restart"
        return Answer(await daemon.send("POST", path, headers=headers, content=b""))

    async def _daemon(self, caller: SandboxCaller, user: str | None = None) -> DaemonClient:
        refusal = user_refusal(user)
        if refusal is not None:
            raise Forbidden(refusal)
        return await self._sandboxes.daemon(caller.tenant, caller.sandbox_id)

    def _record(
        self, caller: SandboxCaller, action: str, details: Mapping[str, object] | None = None
    ) -> None:
        self._sandboxes.record(
            caller.tenant, caller.key_id, action, caller.sandbox_id, details=details
        )


class FileWriter:
    """Writes files into one sandbox, each on the audit record before its first byte."""

    def __init__(
        self, daemon: DaemonClient, calls: SandboxCalls, caller: SandboxCaller, *,
        clip_paths: bool = True, user: str | None = None,
    ) -> None:  # fmt: skip
        self._daemon = daemon
        self._user = user
        self._calls = calls
        self._caller = caller
        self._clip_paths = clip_paths

    def write(self, path: str, headers: Headers, body: Body) -> Coroutine[None, None, Answer]:
        """Record the write of ``path`` now; the returned coroutine sends ``body`` (so an
        upload may run as a task while its body is still arriving)."""
        kept = clip(path) if self._clip_paths else path
        self._calls._record(self._caller, "sandbox.write_file", {"path": kept})
        return self._send(path, headers, body)

    async def _send(self, path: str, headers: Headers, body: Body) -> Answer:
        return Answer(
            await self._daemon.send(
                "POST",
                "/files",
                params={"path": path, **_as(self._user)},
                headers=headers,
                content=body,
            )
        )


def _as(user: str | None) -> dict[str, str]:
    """The query that tells the daemon who a call acts as (none: its default user)."""
    return {} if user is None else {"username": user}


async def _read(body: Body) -> bytes:
    return b"".join([chunk async for chunk in body])


def _audited(method: str, body: bytes) -> dict[str, object]:
    """What the audit keeps of a daemon call: the command line, paths, the signal; never
    stdin or environment values. The body is the client's: parsed leniently, bounded."""
    message = _message(body)
    if method == "Start":
        process = message.get("process") if isinstance(message.get("process"), dict) else {}
        assert isinstance(process, dict)
        words = [process.get("cmd"), *(process.get("args") or [])]
        envs = process.get("envs")
        started: dict[str, object] = {
            "command": clip(" ".join(str(word) for word in words if word is not None)),
            "cwd": clip(str(process.get("cwd") or "")),
            "env": sorted(envs)[:100] if isinstance(envs, dict) else [],
        }
        pty = message.get("pty")
        if isinstance(pty, dict):  # a terminal: its size, as asked
            size = pty.get("size") if isinstance(pty.get("size"), dict) else {}
            assert isinstance(size, dict)
            started["pty"] = clip(f"{size.get('rows')}x{size.get('cols')}")
        return started
    if method == "SendInput":
        return {"process": message.get("process"), "bytes": len(body)}
    return {
        name: clip(str(message[name]))
        for name in ("path", "source", "destination", "process", "signal")
        if name in message
    }


def _message(body: bytes) -> dict[str, object]:
    payload = body[5:] if body[:1] in (b"\x00", b"\x01") else body  # a Connect envelope
    try:
        message = json.loads(payload)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}

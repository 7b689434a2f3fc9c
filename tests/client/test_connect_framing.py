"""The SDK's pure helpers: Connect envelopes, error mapping, requests and results."""

from __future__ import annotations

import json
import struct

import pytest

from ringfence.client import CommandTimeout, FileNotFound, ProcessNotFound, ResourceExhausted
from ringfence.client._commands import check_user, end_result, start_message
from ringfence.client._connect import Decoder, envelope, error_from_answer
from ringfence.client._sandbox import list_params, sandbox_spec
from ringfence.errors import (
    InvalidRequest,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    Unauthenticated,
)


def _frame(message: object, flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def test_an_envelope_is_a_header_and_json() -> None:
    framed = envelope({"a": 1})
    assert framed[:5] == struct.pack(">BI", 0, len(framed) - 5)
    assert json.loads(framed[5:]) == {"a": 1}


def test_the_decoder_cuts_messages_at_any_byte_boundary() -> None:
    body = _frame({"n": 1}) + _frame({"n": 2}) + _frame({}, flags=2)
    decoder = Decoder(FileNotFound)
    got = [m for i in range(len(body)) for m in decoder.feed(body[i : i + 1])]
    assert got == [{"n": 1}, {"n": 2}] and decoder.ended


def test_an_end_stream_error_is_raised_typed() -> None:
    decoder = Decoder(ProcessNotFound)
    with pytest.raises(ProcessNotFound):
        list(decoder.feed(_frame({"error": {"code": "not_found", "message": "x"}}, flags=2)))
    with pytest.raises(SandboxError):
        list(Decoder(FileNotFound).feed(struct.pack(">BI", 1, 2) + b"{}"))  # compressed


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, {"error": {"code": "not_found", "message": "no sandbox"}}, SandboxNotFound),
        (409, {"error": {"code": "sandbox_not_running", "message": "ended"}}, SandboxNotRunning),
        (401, {"error": {"code": "unauthenticated", "message": "key"}}, Unauthenticated),
        (404, {"code": "not_found", "message": "stat x"}, FileNotFound),
        (409, {"code": "already_exists", "message": "x"}, InvalidRequest),
        (400, {"code": "invalid_argument", "message": "x"}, InvalidRequest),
        (429, {"code": "resource_exhausted", "message": "x"}, ResourceExhausted),
        (500, {"code": "internal", "message": "x"}, SandboxError),
        (404, {"code": 404, "message": "open x"}, FileNotFound),
        (507, {"code": 507, "message": "disk full"}, ResourceExhausted),
        (502, None, SandboxError),
    ],
)
def test_error_answers_map_to_typed_errors(
    status: int, body: object, expected: type[Exception]
) -> None:
    raw = b"" if body is None else json.dumps(body).encode()
    assert type(error_from_answer(status, raw, from_sandbox=False)) is expected


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (404, "not_found", FileNotFound),
        (400, "invalid_request", InvalidRequest),
        (507, "resource_exhausted", ResourceExhausted),
        (502, "sandbox_error", SandboxError),
        # The server never lets a sandbox say these; were one to, it is not believed.
        (401, "unauthenticated", SandboxError),
        (409, "sandbox_not_running", SandboxError),
    ],
)
def test_a_sandboxs_refusal_in_the_native_shape_maps_to_typed_errors(
    status: int, code: str, expected: type[Exception]
) -> None:
    raw = json.dumps({"error": {"code": code, "message": "x"}}).encode()
    assert type(error_from_answer(status, raw, from_sandbox=True)) is expected


def test_start_messages() -> None:
    shell = start_message("echo hi", envs={"A": "1"}, cwd="/tmp", stdin=True, timeout=1.5)
    assert shell == {
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"},
                    "cwd": "/tmp"},
        "stdin": True,
        "timeoutMs": 1500,
    }  # fmt: skip
    argv = start_message(["ls", "-l"], envs=None, cwd=None, stdin=False, timeout=None)
    assert argv == {"process": {"cmd": "ls", "args": ["-l"]}, "stdin": False}
    for bad in ("  ", []):
        with pytest.raises(InvalidRequest):
            start_message(bad, envs=None, cwd=None, stdin=False, timeout=None)
    with pytest.raises(InvalidRequest):
        start_message("x", envs=None, cwd=None, stdin=False, timeout=-1)
    check_user("user")
    check_user("root")  # root inside: the sandbox refuses it where its host cannot map it
    check_user(None)
    with pytest.raises(InvalidRequest):
        check_user("bob")


def test_end_results() -> None:
    assert end_result({"exited": True, "status": "exit status 0"}, "o", "e").exit_code == 0
    killed = end_result({"exitCode": -1, "exited": False, "status": "signal: killed"}, "", "")
    assert (killed.exit_code, killed.error) == (-1, "signal: killed")
    with pytest.raises(CommandTimeout) as exc:
        end_result({"exitCode": -1, "exited": False, "error": "timed out"}, "partial", "")
    assert exc.value.result.stdout == "partial"


def test_sandbox_requests_are_checked_before_sending() -> None:
    spec = sandbox_spec("base", 10, {"A": "1"}, {"k": "v"}, {"memory": "64M"})
    assert spec.limits.memory == 64 << 20
    with pytest.raises(InvalidRequest):
        sandbox_spec("base", None, {"bad name": "x"}, None, None)
    assert list_params(["running", "killed"], {"k": "v"}, 5) == [
        ("state", "running"), ("state", "killed"), ("metadata", "k=v"), ("limit", 5),
    ]  # fmt: skip
    assert list_params("expired", None, 1) == [("state", "expired"), ("limit", 1)]


def test_a_sandbox_cannot_forge_the_servers_errors() -> None:
    """A daemon answering with the server's error shape is still the sandbox talking."""
    forged = json.dumps({"error": {"code": "unauthenticated", "message": "re-enter key"}})
    assert type(error_from_answer(401, forged.encode(), from_sandbox=False)) is Unauthenticated
    from_daemon = error_from_answer(401, forged.encode(), from_sandbox=True)
    assert not isinstance(from_daemon, Unauthenticated)
